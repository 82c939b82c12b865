"""Load on ``dyntc serve``: throughput by concurrency, then predict latency beside writers and beside
maximal requests.

Fits a classifier on a CLINC150 sample (default encoder: MiniLM, Euclidean; ``--encoder sru`` for the
paper's), serves it with a uvicorn subprocess on 127.0.0.1 with its default limits, and measures:

1. ``levels``: ``--requests`` /predict requests of ``--batch`` test texts at each concurrency, a label
   added half-way through each level (and timed);
2. ``mixed``: ``--predictors`` client threads sending one-text predictions (each waits ``--pace-ms``
   between requests), without and beside writers: an HTTP writer adding examples through the service,
   ``dyntc labels add-examples`` processes one after another on the same model directory, and a
   process that takes the store's write lock for 1 s in every 2 s (a slow writer). Predict and write
   latency p50 / p99 / max, and predict p99 beside the writers over p99 without;
3. ``maximal``: one-text predictions without and beside another client sending maximal requests (the
   service's ``max_batch`` texts of ``max_text_chars`` characters) back to back;
4. ``slow`` and ``burst`` (:mod:`bench.serve_load`): a predicting client beside ``--slow`` slow
   connections, and beside a burst of writes (head refreshes, CPU after the burst, p99 over idle).
   The issue-sized run: ``--intents 150 --phases slow,burst`` (15,000 support texts).

Phases 2 and 3 alternate ``--rounds`` windows without and with their load (``--seconds`` in all on each
side), so that other work on the machine weighs on both sides alike.

Bounded: a fixed time or number of requests per phase, each request with a timeout; loopback only.

    .venv/bin/python -m bench.serve
    .venv/bin/python -m bench.serve --intents 150 --phases slow,burst
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench import serve_load
from bench._machine import cpu_model, load_average
HOLD_LOCK = """
import sqlite3, sys, time
end = time.time() + float(sys.argv[2])
while time.time() < end:
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
    db.execute("BEGIN IMMEDIATE"); time.sleep(1.0); db.execute("ROLLBACK"); db.close()
    time.sleep(1.0)
"""


def call(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict, float]:
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), time.perf_counter() - t0


def stats(seconds: list[float]) -> str:
    if not seconds:
        return "– | – | –"
    ms = np.array(seconds) * 1000
    return f"{np.percentile(ms, 50):.0f} | {np.percentile(ms, 99):.0f} | {ms.max():.0f}"


def p99(seconds: list[float]) -> float:
    return float(np.percentile(np.array(seconds) * 1000, 99))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Predictors:
    """`n` threads sending one-text predictions, each pausing `pace_s` between requests, for `seconds`."""

    def __init__(self, url: str, texts: list[str], n: int, pace_s: float, seconds: float):
        self.url, self.texts, self.n, self.pace_s, self.seconds = url, texts, n, pace_s, seconds
        self.latencies: list[float] = []
        self.errors = 0

    def _one(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            status, _, took = call(self.url, "POST", "/predict", {"texts": [self.texts[rng.integers(len(self.texts))]]})
            if status == 200:
                self.latencies.append(took)
            else:
                self.errors += 1
            time.sleep(self.pace_s)

    def run(self) -> "Predictors":
        threads = [threading.Thread(target=self._one, args=(i,)) for i in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="minilm", choices=["minilm", "sru"])
    ap.add_argument("--requests", type=int, default=96, help="levels: requests per concurrency level")
    ap.add_argument("--batch", type=int, default=8, help="levels: texts per request")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--predictors", type=int, default=2, help="mixed/maximal: client threads sending one-text predicts")
    ap.add_argument("--pace-ms", type=float, default=20.0, help="mixed/maximal: pause of each predictor between requests")
    ap.add_argument("--seconds", type=float, default=60.0, help="mixed/maximal: length of each side of a phase")
    ap.add_argument("--rounds", type=int, default=6, help="mixed/maximal: alternating windows without / with the load")
    ap.add_argument("--intents", type=int, default=20, help="CLINC150 intents served (150: every one, 15,000 texts)")
    ap.add_argument("--slow", type=int, default=1000, help="slow: connections dripping a byte every 10 s")
    ap.add_argument("--slow-seconds", type=float, default=60.0, help="slow: seconds with the slow connections open")
    ap.add_argument("--burst-writes", type=int, default=40)
    ap.add_argument("--burst-seconds", type=float, default=30.0)
    ap.add_argument("--after-seconds", type=float, default=30.0)
    ap.add_argument("--phases", default="levels,mixed,maximal")
    args = ap.parse_args()
    if args.requests < 2 or args.batch < 1 or args.predictors < 1 or args.seconds <= 0 or args.rounds < 1:
        ap.error("--requests must be >= 2, --batch, --predictors and --rounds >= 1, --seconds > 0")
    phases = set(args.phases.split(","))
    if not phases <= {"levels", "mixed", "maximal", "slow", "burst"}:
        ap.error("--phases: a comma-separated subset of levels,mixed,maximal,slow,burst")

    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load
    from dyntc.classifier.service.limits import Limits

    data = load("clinc150")
    intents = sorted(set(data.train.labels))[:args.intents]
    keep = set(intents)
    train = [(t, y) for t, y in zip(data.train.texts, data.train.labels) if y in keep]
    tests = [t for t, y in zip(data.test.texts, data.test.labels) if y in keep]
    clf = DynamicClassifier(encoder=args.encoder, episodes=100, eval_every=50)
    clf.fit([t for t, _ in train], [y for _, y in train])
    workdir = Path(tempfile.mkdtemp(prefix="dyntc-bench-serve-"))
    model = clf.save(workdir / "model")
    limits = Limits()
    print(f"# dyntc serve, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: {args.encoder} model, {args.intents} CLINC150 "
          f"intents, {len(train)} support texts, default limits; CPU {cpu_model()}, {os.cpu_count()} cores, "
          f"load {load_average()}")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DYNTC_CACHE": str(workdir / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "dyntc", "serve", str(model), "--port", str(port)],
                            env=env, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                call(url, "GET", "/healthz")
                break
            except OSError:
                time.sleep(0.2)
        call(url, "POST", "/predict", {"texts": tests[: args.batch]})  # warm-up
        if "levels" in phases:
            levels(url, tests, args)
        if "mixed" in phases:
            mixed(url, model, tests, args, env)
        if "maximal" in phases:
            maximal(url, tests, args, limits)
        if "slow" in phases:
            serve_load.slow(url, port, tests, args, call)
        if "burst" in phases:
            serve_load.burst(url, proc.pid, tests, intents[0], args, call)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def levels(url: str, tests: list[str], args) -> None:
    print(f"\n## Throughput: {args.requests} requests x {args.batch} texts per concurrency level\n")
    print("| concurrency | p50 ms | p99 ms | texts/s | label op ms (mid-run) | healthz ms during load |")
    print("|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for level in [int(x) for x in args.levels.split(",")]:
        batches = [[tests[i] for i in rng.choice(len(tests), args.batch)] for _ in range(args.requests)]
        latencies: list[float] = []
        op: dict[str, float] = {}

        def one(i: int) -> None:
            if i == args.requests // 2:
                t0 = time.perf_counter()
                call(url, "POST", "/labels", {"name": f"new_{level}", "examples": ["book a table for two",
                                                                                     "reserve a table tonight"]})
                op["label"] = time.perf_counter() - t0
                op["health"] = call(url, "GET", "/healthz")[2]
            latencies.append(call(url, "POST", "/predict", {"texts": batches[i]})[2])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(level) as pool:
            list(pool.map(one, range(args.requests)))
        wall = time.perf_counter() - t0
        ms = np.array(latencies) * 1000
        print(f"| {level} | {np.percentile(ms, 50):.0f} | {np.percentile(ms, 99):.0f} | "
              f"{args.requests * args.batch / wall:.0f} | {op['label'] * 1000:.0f} | {op['health'] * 1000:.1f} |",
              flush=True)


def alternate(url: str, tests: list[str], n: int, args, start_load, stop_load) -> tuple[list[float], list[float]]:
    """Predictions without and with a load, in ``--rounds`` alternating windows of ``--seconds / rounds``
    each, so that anything else on the machine weighs on both sides alike."""
    window = args.seconds / args.rounds
    without: list[float] = []
    beside: list[float] = []
    for _ in range(args.rounds):
        without += Predictors(url, tests, n, args.pace_ms / 1000, window).run().latencies
        handle = start_load()
        beside += Predictors(url, tests, n, args.pace_ms / 1000, window).run().latencies
        stop_load(handle)
    return without, beside


def mixed(url: str, model: Path, tests: list[str], args, env: dict) -> None:
    print(f"\n## Predictions beside writers: {args.predictors} predictors x one text, {args.pace_ms:g} ms apart, "
          f"{args.rounds} alternating windows of {args.seconds / args.rounds:g} s without and with the writers\n")
    print("| run | predicts | predict p50 ms | p99 | max | writes | write p50 ms | p99 | max | predict p99 / without |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    http_writes: list[float] = []
    cli_writes: list[float] = []
    failures: list[str] = []
    label = sorted(call(url, "GET", "/labels")[1]["labels"])[0]

    def http_writer(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            status, body, took = call(url, "POST", f"/labels/{label}/examples", {"examples": [f"an http example {i}"]})
            (http_writes if status == 200 else failures).append(took if status == 200 else f"http {status} {body}")
            i += 1
            stop.wait(0.5)

    def cli_writer(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "dyntc", "labels", "add-examples", str(model), label,
                                   "-e", f"a cli example {i}"], env={**env, "OMP_NUM_THREADS": "1"},
                                  capture_output=True, text=True, timeout=300)
            (cli_writes if done.returncode == 0 else failures).append(
                time.perf_counter() - t0 if done.returncode == 0 else f"cli {done.stderr[-200:]}")
            i += 1

    def start_load():
        stop = threading.Event()
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(model / "dyntc.sqlite"),
                                   str(args.seconds / args.rounds)])
        threads = [threading.Thread(target=http_writer, args=(stop,)), threading.Thread(target=cli_writer, args=(stop,))]
        for t in threads:
            t.start()
        return stop, threads, holder

    def stop_load(handle) -> None:
        stop, threads, holder = handle
        stop.set()
        for t in threads:
            t.join()
        holder.wait(60)

    without, beside = alternate(url, tests, args.predictors, args, start_load, stop_load)
    print(f"| without writers | {len(without)} | {stats(without)} | 0 | {stats([])} | 1.00 |")
    print(f"| beside the writers: HTTP | {len(beside)} | {stats(beside)} | {len(http_writes)} | {stats(http_writes)} | "
          f"{p99(beside) / p99(without):.2f} |")
    print(f"| (same windows) CLI writers, a lock holder 1 s in 2 | | | | | {len(cli_writes)} | {stats(cli_writes)} | |")
    if failures:
        print(f"\nFAILURES: {len(failures)} writes: {failures[:3]}")
    print("\n(CLI write latency is a whole `dyntc labels add-examples` process: start, load, embed, commit.)",
          flush=True)


def maximal(url: str, tests: list[str], args, limits) -> None:
    print(f"\n## A one-text prediction beside maximal requests ({limits.max_batch} texts x {limits.max_text_chars} "
          f"characters), {args.rounds} alternating windows of {args.seconds / args.rounds:g} s\n")
    print("| run | predicts | predict p50 ms | p99 | max | maximal requests | their p50 ms | p99 | max | predict p99 / idle |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(1)
    words = " ".join(tests).split()
    big: list[float] = []

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            texts = [" ".join(rng.choice(words, 600))[: limits.max_text_chars] for _ in range(limits.max_batch)]
            status, body, took = call(url, "POST", "/predict", {"texts": texts})
            if status != 200:
                raise RuntimeError(f"maximal request answered {status}: {body}")
            big.append(took)

    def start_load():
        stop = threading.Event()
        flooder = threading.Thread(target=flood, args=(stop,))
        flooder.start()
        time.sleep(0.5)  # the first maximal request is being embedded
        return stop, flooder

    def stop_load(handle) -> None:
        stop, flooder = handle
        stop.set()
        flooder.join()  # its request in flight finishes before the next idle window

    idle, beside = alternate(url, tests, 1, args, start_load, stop_load)
    print(f"| idle | {len(idle)} | {stats(idle)} | 0 | {stats([])} | 1.00 |")
    print(f"| beside maximal requests | {len(beside)} | {stats(beside)} | {len(big)} | {stats(big)} | "
          f"{p99(beside) / p99(idle):.2f} |", flush=True)


if __name__ == "__main__":
    main()
