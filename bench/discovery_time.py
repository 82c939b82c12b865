"""How long ``discover`` takes on texts never embedded before, embedding included, per runtime and mode.

The texts: the first ``--texts`` unlabelled training texts of CLINC150's protocol split (KCR 75 %,
LAR 10 %, seed 0; see bench/discovery.py), shuffled. ``DynamicClassifier(encoder_options={"runtime":
R}).fit(labelled)`` then ``discover(texts, n_new, mode=M)`` with ``n_new`` the true number of new
intents, in a process whose embedding cache starts empty (``DYNTC_CACHE`` points at a fresh folder,
so the ONNX export of ``fit`` is made there and reused by ``discover``). Reported: seconds of
``discover`` (embedding + clustering), of which clustering, and the clustering's NMI / ARI / ACC on
those texts against their true intents (a text assigned to a known label counts as that label;
noise as one more cluster). Each (runtime, mode) runs in its own process, so no cache is shared.

    DYNTC_DATA=/path/to/datasets python -m bench.discovery_time [--texts 10000] [--runtimes torch,onnx-int8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def one(runtime: str, mode: str, n_texts: int, dataset: str) -> dict:
    from bench.discovery import protocol_split, scores
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    data = load(dataset)
    known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, 0.75, 0)
    truth = dict(zip(data.train.texts, data.train.labels))
    texts = [unlabelled[i] for i in np.random.default_rng(0).permutation(len(unlabelled))[:n_texts]]
    n_new = len(set(data.train.labels)) - len(known)
    clf = DynamicClassifier(seed=0, encoder_options={"runtime": runtime}).fit(*labelled)
    start = time.perf_counter()
    found = clf.discover(texts, n_new, mode=mode)
    seconds = time.perf_counter() - start
    pred = ["(noise)" if a is None else a for a in found.assignments]
    return {"runtime": runtime, "mode": mode, "texts": len(texts), "n_new": n_new, "seconds": seconds,
            "cluster_seconds": found.seconds, "scores": scores([truth[t] for t in texts], pred),
            "clusters": len(found.clusters), "counts": found.counts()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=10000)
    parser.add_argument("--runtimes", default="torch,onnx-int8")
    parser.add_argument("--modes", default="fast,default")
    parser.add_argument("--dataset", default="clinc150")
    parser.add_argument("--one", nargs=2, metavar=("RUNTIME", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(*args.one, args.texts, args.dataset)), flush=True)
        return
    from bench.discovery import cpu_name

    print(f"CPU {cpu_name()} ({os.cpu_count()} cores), {args.texts} texts of {args.dataset}", flush=True)
    lines = ["| runtime | mode | texts | s (embedding + discover) | of which clustering | NMI / ARI / ACC on the texts |",
             "|---|---|---:|---:|---:|---|"]
    for runtime in args.runtimes.split(","):
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory() as cache:
                out = subprocess.run([sys.executable, "-m", "bench.discovery_time", "--one", runtime, mode,
                                      "--texts", str(args.texts), "--dataset", args.dataset],
                                     env={**os.environ, "DYNTC_CACHE": cache}, capture_output=True, text=True)
            found = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if not found:
                raise SystemExit(f"{runtime}/{mode} failed:\n{out.stderr[-3000:]}")
            r = json.loads(found[0][len("RESULT "):])
            print(json.dumps(r), flush=True)
            lines.append(f"| {runtime} | {mode} | {r['texts']} | {r['seconds']:.0f} | {r['cluster_seconds']:.1f} | "
                         + " / ".join(f"{v:.1f}" for v in r["scores"]) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
