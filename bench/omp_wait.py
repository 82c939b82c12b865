"""One-text ``predict`` latency of ``DynamicClassifier()`` (frozen all-MiniLM-L6-v2) in a library
process while another process keeps a core busy: the OpenMP wait policy the library now sets
(``OMP_WAIT_POLICY=PASSIVE`` when ``import dyntc`` comes before torch and the user set none) against
the OpenMP default a process got before (torch imported first, policy unset), and one torch thread.

    python -m bench.omp_wait [--texts 40] [--busy 1]

Each variant runs in its own process (the policy is read once, when torch loads its OpenMP runtime;
this module runs them as a script, since ``bench/__init__.py`` sets the policy for every benchmark),
one after the other, while ``--busy`` busy-loop processes run. Prints the CPU, the load average, the
median and 90th percentile latency of each variant and its ratio to the old default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TRAIN = {
    "alarm": ["wake me up at six", "set an alarm for 7 am", "alarm for tomorrow morning", "please wake me at 6:30"],
    "balance": ["what is my balance", "how much money do i have", "show my account balance", "check my bank balance"],
    "timer": ["set a timer for ten minutes", "start a 5 minute timer", "timer for 30 seconds", "count down one minute"],
    "weather": ["what is the weather today", "will it rain tomorrow", "is it going to be sunny", "is it cold outside"],
}
VARIANTS = {
    "old default (torch imported first, policy unset)": "old",
    "import dyntc first (PASSIVE set by the library)": "library",
    "torch.set_num_threads(1)": "one-thread",
}


def child(variant: str, n: int) -> dict:
    if variant in ("old", "one-thread"):
        import torch  # before dyntc: the library cannot set the policy, as before it did not

        if variant == "one-thread":
            torch.set_num_threads(1)
    from dyntc import DynamicClassifier

    import torch

    clf = DynamicClassifier().fit([t for ts in TRAIN.values() for t in ts], [y for y, ts in TRAIN.items() for _ in ts])
    queries = [f"could you set an alarm for {h} o'clock number {i}" for i in range(n) for h in [i % 12 + 1]]
    for q in queries[:3]:  # warm-up
        clf.predict([q + " warm"])
    times = []
    for q in queries:
        t0 = time.perf_counter()
        clf.predict([q])
        times.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.05)  # a request arrives, the runtime idles in between (what a service sees)
    times.sort()
    return {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))],
            "threads": torch.get_num_threads(), "policy": os.environ.get("OMP_WAIT_POLICY", "unset")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=40, help="one-text predictions timed per variant")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes running meanwhile")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.texts)))
        return
    from bench._machine import cpu_model, load_average

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["DYNTC_CACHE"] = "off"  # every query is embedded
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows = {}
    try:
        for label, variant in VARIANTS.items():
            # run as a script, not `-m bench.omp_wait`: bench/__init__.py would set the policy for every variant
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--texts", str(args.texts)],
                                 env=env, capture_output=True, text=True, check=True)
            rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; load average {load_average()}; "
          f"{args.busy} busy process(es); {args.texts} one-text predictions per variant; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    base = rows[next(iter(VARIANTS))]["median_ms"]
    print("| variant | torch threads | OMP_WAIT_POLICY | median ms | p90 ms | median vs old default |")
    print("|---|---|---|---|---|---|")
    for label, r in rows.items():
        print(f"| {label} | {r['threads']} | {r['policy']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | "
              f"{r['median_ms'] / base:.2f}x |")


if __name__ == "__main__":
    main()
