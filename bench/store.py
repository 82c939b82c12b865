"""Bytes a model store writes per version, and how long its operations take, on SQLite.

Builds a store directly through ``ModelStore`` (random 384-d points, the size of the MiniLM default's,
no encoder): a 1,000-example label and ``--labels`` labels of 100; then measures the file's growth
(write-ahead log checkpointed into it) and the time of: adding one example to the big label, renaming
it, merging two small labels, restoring the previous version, ``--ops`` more small operations, reading
the head, and ``prune``.

    .venv/bin/python -m bench.store
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from bench._machine import cpu_model, load_average
from dyntc.classifier.store import ModelStore

DIM = 384


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labels", type=int, default=40, help="labels of 100 examples beside the 1,000-example one")
    ap.add_argument("--ops", type=int, default=200, help="small operations after the measured ones")
    args = ap.parse_args()
    if args.labels < 2 or args.ops < 1:
        ap.error("--labels must be >= 2 and --ops >= 1")
    rng = np.random.default_rng(0)

    def support(prefix: str, n: int, part: int = 0):
        return [f"{prefix} example {i}" for i in range(n)], torch.from_numpy(
            rng.standard_normal((n, DIM)).astype("float32")), [part] * n

    path = Path(tempfile.mkdtemp(prefix="dyntc-bench-store-")) / "model"
    store = ModelStore.create(path)

    def commit(labels, replace_all=False, op="op"):
        with store.transaction() as txn:
            return txn.commit(op=op, detail=[{"op": op}], document={"dim": DIM}, weights=b"weights", labels=labels,
                              replace_all=replace_all)

    def size() -> int:
        with sqlite3.connect(store.file) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return store.file.stat().st_size

    state = {"big": support("big", 1000), **{f"l{i}": support(f"l{i}", 100) for i in range(args.labels)}}
    commit(state, replace_all=True, op="save")
    print(f"# model store (SQLite), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: one label of 1,000 examples and "
          f"{args.labels} of 100, {DIM}-d points; CPU {cpu_model()}, load {load_average()}\n")
    print("| operation | bytes written | ms |")
    print("|---|---:|---:|")

    def measure(name: str, fn) -> None:
        before = size()
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1000
        print(f"| {name} | {size() - before:,} | {ms:.1f} |", flush=True)

    def add_one():
        texts, points, parts = state["big"]
        extra = support("one more", 1)
        state["big"] = (texts + extra[0], torch.cat([points, extra[1]]), parts + [0])
        commit({"big": state["big"]})

    def rename():
        state["renamed"] = state.pop("big")
        commit({"big": None, "renamed": state["renamed"]})

    def merge():
        a, b = state.pop("l0"), state.pop("l1")
        state["merged"] = (a[0] + b[0], torch.cat([a[1], b[1]]), [0] * len(a[0]) + [1] * len(b[0]))
        commit({"l0": None, "l1": None, "merged": state["merged"]})

    def restore():
        with store.transaction() as txn:
            txn.restore(txn.head - 1)

    measure("save of the whole state, unchanged", lambda: commit(state, replace_all=True, op="save"))
    measure("add one example to the 1,000-example label", add_one)
    measure("rename the 1,000-example label", rename)
    measure("merge two 100-example labels", merge)
    measure("restore the version before the merge", restore)
    before, t0 = size(), time.perf_counter()
    for step in range(args.ops):
        name = f"l{2 + step % (args.labels - 2)}"
        texts, points, parts = store.read().labels[name]
        extra = support(f"op {step}", 1)
        commit({name: (list(texts) + extra[0], torch.cat([points, extra[1]]), list(parts) + [0])})
    print(f"| {args.ops} one-example additions (each reads the head first), per version | "
          f"{(size() - before) // args.ops:,} | {(time.perf_counter() - t0) * 1000 / args.ops:.1f} |")
    t0 = time.perf_counter()
    head = store.read()
    print(f"| read the head ({sum(len(v[0]) for v in head.labels.values()):,} examples, every point verified) | – | "
          f"{(time.perf_counter() - t0) * 1000:.1f} |")
    before, t0 = size(), time.perf_counter()
    result = store.prune(10)
    print(f"| prune to the newest 10 versions ({result['versions_removed']} removed) | {size() - before:,} | "
          f"{(time.perf_counter() - t0) * 1000:.1f} |")


if __name__ == "__main__":
    main()
