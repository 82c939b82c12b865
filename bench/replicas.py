"""Replicas of ``dyntc serve`` over one PostgreSQL store, on loopback: how soon a write is served by
every replica, predict throughput of 3 replicas against 1, and lost writes under concurrent writers on
all replicas with one replica killed (SIGKILL) among them.

Starts a throwaway PostgreSQL server (Debian's binaries, as tests/_postgres.py does; or ``--url`` an
existing database), fits a classifier on a CLINC150 sample (default: the tiny SRU model of the tests,
``--encoder minilm`` for the pretrained default), saves it into the database and starts the replicas
(``dyntc serve URL``, default limits). Phases:

1. ``visible``: ``--writes`` label additions, through each replica in turn and every fifth through
   the CLI (``dyntc labels add URL``); after each is acknowledged, every replica's ``/healthz`` is
   polled (every 5 ms) until it serves that version: p50 / p99 / max of that delay. ``/healthz``
   reports the version a replica serves without loading anything, so this is the background
   follower's delay (LISTEN/NOTIFY), not a reader's;
2. ``throughput``: ``--clients`` threads send /predict requests of ``--batch`` texts for ``--seconds``
   to 1 replica, then spread over all replicas;
3. ``lost``: two writer threads per replica add labels for ``--seconds``; one replica is killed with
   SIGKILL a third of the way in; every acknowledged label must be in the store.

    .venv/bin/python -m bench.replicas
    .venv/bin/python -m bench.replicas --encoder minilm --intents 150 --phases visible
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench._machine import cpu_model, load_average

TINY = dict(encoder="sru", hidden_size=16, num_layers=1, dropout=0.0, max_len=16, episodes=5, n_query=16, lr=3e-3)


def call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def ms(values: list[float]) -> str:
    a = np.array(values) * 1000
    return f"{np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | {a.max():.0f}"


class Replica:
    def __init__(self, model: str, env: dict, workers: int):
        from tests._postgres import _free_port

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "dyntc", "serve", model, "--port", str(self.port),
                     "--workers", str(workers)]
        self.env = env
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, env=self.env, stderr=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                if call(self.url, "GET", "/healthz", timeout=5)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("a replica did not start")

    def serving(self) -> int:
        try:
            return call(self.url, "GET", "/healthz", timeout=5)[1].get("version") or 0
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def visible(replicas: list[Replica], model: str, env: dict, writes: int) -> None:
    delays, acks, cli = [], [], []
    for k in range(writes):
        name = f"visible_{k}"
        t0 = time.perf_counter()
        if k % 5 == 4:
            subprocess.run([sys.executable, "-m", "dyntc", "labels", "add", model, name, "-e", f"{name} one",
                            "-e", f"{name} two"], env=env, check=True, capture_output=True)
            from dyntc.classifier.store import ModelStore

            version = ModelStore.open(model).head_version()
        else:
            status, body = call(replicas[k % len(replicas)].url, "POST", "/labels",
                                {"name": name, "examples": [f"{name} one", f"{name} two"]})
            assert status == 201, body
            version = body["version"]
        acked = time.perf_counter()
        (cli if k % 5 == 4 else acks).append(acked - t0)
        while not all(r.serving() >= version for r in replicas):
            if time.perf_counter() - acked > 10:
                raise RuntimeError(f"version {version} not served everywhere after 10 s")
            time.sleep(0.005)
        delays.append(time.perf_counter() - acked)
    print("| measure | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|")
    print(f"| write acknowledged -> served by all {len(replicas)} replicas ({writes} writes, 1 in 5 by the CLI) | "
          f"{ms(delays)} |")
    print(f"| an HTTP write (POST /labels) until acknowledged | {ms(acks)} |")
    print(f"| a `dyntc labels add` process, start to exit | {ms(cli)} |\n", flush=True)
    read_costs(model)


def read_costs(model: str) -> None:
    """What a replica reads to follow a write: the labels changed since the version it serves
    (``changes_since``), against the whole version (what it read before, and at start)."""
    from dyntc.classifier.store import ModelStore

    store = ModelStore.open(model)
    snap = store.read()
    n = sum(len(texts) for texts, _, _ in snap.labels.values())
    full, delta = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        store.read()
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        changes = store.changes_since(snap.store_id, snap.version - 1)
        delta.append(time.perf_counter() - t0)
    changed = sum(len(texts) for texts, _, _ in changes.labels.values())
    per_example = min(full) / n
    print("| read by a replica | examples | best of 3, ms |\n|---|---:|---:|")
    print(f"| the last write's difference (`changes_since`) | {changed} | {min(delta) * 1000:.0f} |")
    print(f"| the whole newest version (`read`) | {n} | {min(full) * 1000:.0f} |")
    print(f"\nA write is read as the whole support of each label it changed: at {per_example * 1e6:.0f} µs per "
          f"example, a label of about {0.5 / per_example:,.0f} examples takes half a second to read here.\n", flush=True)


def throughput(targets: list[Replica], texts: list[str], clients: int, batch: int, seconds: float) -> float:
    done, lock = [0], threading.Lock()
    end = time.perf_counter() + seconds
    cycle = itertools.cycle(targets)

    def client(i: int) -> None:
        rng = np.random.default_rng(i)
        target = next(cycle)
        while time.perf_counter() < end:
            status, _ = call(target.url, "POST", "/predict", {"texts": [texts[j] for j in rng.choice(len(texts), batch)]})
            if status == 200:
                with lock:
                    done[0] += batch

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.perf_counter() - t0)


def lost(replicas: list[Replica], model: str, seconds: float) -> None:
    acknowledged, errors, lock = [], [0], threading.Lock()
    end = time.perf_counter() + seconds

    def writer(r: Replica, w: int) -> None:
        for k in itertools.count():
            if time.perf_counter() >= end:
                return
            name = f"lost_{r.port}_{w}_{k}"
            try:
                status, body = call(r.url, "POST", "/labels", {"name": name, "examples": [f"{name} a", f"{name} b"]},
                                    timeout=30)
            except OSError:
                with lock:
                    errors[0] += 1
                if r.proc.poll() is not None:
                    return
                continue
            with lock:
                if status == 201:
                    acknowledged.append(name)
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=writer, args=(r, w)) for r in replicas for w in range(2)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    replicas[1].proc.send_signal(signal.SIGKILL)
    for t in threads:
        t.join()
    from dyntc import DynamicClassifier

    clf = DynamicClassifier.load(model)
    missing = set(acknowledged) - set(clf.classes_)
    whole = all(clf.support_counts()[n] == 2 for n in acknowledged if n in clf.support_counts())
    print("| writers on every replica, one killed | result |\n|---|---|")
    print(f"| lost writes: {len(acknowledged)} acknowledged by {len(replicas)} replicas (2 writers each, "
          f"{seconds:g} s, replica 2 killed with SIGKILL at {seconds / 3:.0f} s; {errors[0]} writes failed "
          f"unacknowledged) | {len(missing)} lost, every label whole: {whole} |", flush=True)
    replicas[1].start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="sru", choices=["sru", "minilm"])
    ap.add_argument("--url", help="an existing PostgreSQL database (default: a throwaway server)")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--intents", type=int, default=20, help="CLINC150 intents in the model (150: all, 15,000 texts)")
    ap.add_argument("--writes", type=int, default=30)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--phases", default="visible,throughput,lost")
    args = ap.parse_args()
    phases = set(args.phases.split(","))

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    server = None
    if args.url is None:
        from tests._postgres import PostgresServer, _binaries

        server = PostgresServer(_binaries())
        base = server.url("bench")
    else:
        base = args.url
    data = load("clinc150")
    intents = sorted(set(data.train.labels))[:args.intents]
    keep = set(intents)
    train = [(t, y) for t, y in zip(data.train.texts, data.train.labels) if y in keep]
    tests = [t for t, y in zip(data.test.texts, data.test.labels) if y in keep]
    options = TINY if args.encoder == "sru" else dict(encoder="minilm")
    clf = DynamicClassifier(**options).fit([t for t, _ in train], [y for _, y in train])
    model = clf.save(base)
    workdir = Path(tempfile.mkdtemp(prefix="dyntc-bench-replicas-"))
    env = {**os.environ, "DYNTC_CACHE": str(workdir / "cache"), "OMP_NUM_THREADS": "1"}
    print(f"# {args.replicas} replicas of dyntc serve over one PostgreSQL, "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: {'tiny SRU (16-d)' if args.encoder == 'sru' else 'MiniLM'} "
          f"model, {args.intents} CLINC150 intents, {len(train)} support texts; CPU {cpu_model()}, {os.cpu_count()} cores, "
          f"load {load_average()}\n")
    workers = os.cpu_count() or 1
    replicas = [Replica(model, env, workers) for _ in range(args.replicas)]
    try:
        if "visible" in phases:
            visible(replicas, model, env, args.writes)
        if "throughput" in phases:
            call(replicas[0].url, "POST", "/predict", {"texts": tests[:8]})
            one = throughput(replicas[:1], tests, args.clients, args.batch, args.seconds)
            every = throughput(replicas, tests, args.clients, args.batch, args.seconds)
            print(f"| predict throughput ({args.clients} clients x {args.batch} texts, {args.seconds:g} s) | "
                  "1 replica | {n} replicas | ratio |\n|---|---:|---:|---:|".replace("{n}", str(len(replicas))))
            print(f"| texts/s | {one:.0f} | {every:.0f} | x{every / one:.2f} |\n", flush=True)
        if "lost" in phases:
            lost(replicas, model, args.seconds)
    finally:
        for r in replicas:
            r.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
