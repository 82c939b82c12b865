"""Load on ``dyntc serve``: latency and throughput at concurrency 1, 8 and 32, with a label operation mid-run.

Fits a classifier on a CLINC150 sample (default encoder: MiniLM, Euclidean; ``--encoder sru`` for
the paper's), serves it with a uvicorn subprocess on 127.0.0.1, and sends ``--requests`` /predict
requests of ``--batch`` test texts at each concurrency; half-way through each level a label is
added (and timed). Bounded: a fixed number of requests per level, each with a timeout; loopback only.

    DYNTC_DATA=../shared/datasets .venv/bin/python -m bench.serve
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench._machine import cpu_model, load_average

INTENTS = 20


def call(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict, float]:
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status, json.loads(resp.read()), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="minilm", choices=["minilm", "sru"])
    ap.add_argument("--requests", type=int, default=96, help="per concurrency level")
    ap.add_argument("--batch", type=int, default=8, help="texts per request")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    if args.requests < 2 or args.batch < 1:
        ap.error("--requests must be >= 2 and --batch >= 1")
    levels = [int(x) for x in args.levels.split(",")]

    from dyntc import DynamicClassifier
    from dyntc.data.datasets import load

    data = load("clinc150")
    intents = sorted(set(data.train.labels))[:INTENTS]
    keep = set(intents)
    train = [(t, y) for t, y in zip(data.train.texts, data.train.labels) if y in keep]
    tests = [t for t, y in zip(data.test.texts, data.test.labels) if y in keep]
    clf = DynamicClassifier(encoder=args.encoder, episodes=100, eval_every=50)
    clf.fit([t for t, _ in train], [y for _, y in train])
    workdir = Path(tempfile.mkdtemp(prefix="dyntc-bench-serve-"))
    clf.save(workdir / "model")
    print(f"# dyntc serve: {args.encoder} model, {INTENTS} CLINC150 intents, {len(train)} support texts; "
          f"{args.requests} requests x {args.batch} texts per level; CPU {cpu_model()}, {os.cpu_count()} cores, "
          f"load {load_average()}")

    url = f"http://127.0.0.1:{args.port}"
    proc = subprocess.Popen([sys.executable, "-m", "dyntc", "serve", str(workdir / "model"), "--port", str(args.port)],
                            env={**os.environ}, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                call(url, "GET", "/healthz")
                break
            except OSError:
                time.sleep(0.2)
        call(url, "POST", "/predict", {"texts": tests[: args.batch]})  # warm-up
        print("| concurrency | p50 ms | p99 ms | texts/s | label op ms (mid-run) | healthz ms during load |")
        print("|---:|---:|---:|---:|---:|---:|")
        rng = np.random.default_rng(0)
        for level in levels:
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
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
