"""The load phases of ``bench.serve`` (``--phases slow,burst``): slow clients beside a normal one, and
a burst of writes on a large model beside a predicting client.

- ``slow``: one client predicts one text every ``--pace-ms``; in alternating windows (without, with)
  ``--slow`` connections each send a request line and then one byte every 10 s (never a whole
  request; the ones the server closes are reopened). Predict p50 / p99 / max and failures on each
  side, p99 over the p99 without, and how many slow connections the server closed.
- ``burst``: the same client predicts throughout; first ``--burst-seconds`` without writes, then
  ``--burst-writes`` ``POST /labels/{name}/examples`` spread over ``--burst-seconds``, then
  ``--after-seconds`` of quiet. The server's CPU seconds after the last write (from /proc), the head
  refreshes it ran (``/healthz``), its most threads, the seconds until the newest version was
  trained, and predict p99 during the burst over p99 without.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np

DRIP_EVERY_S = 10.0


def _predictor(url: str, texts: list[str], pace_s: float, stop: threading.Event, call) -> tuple[list[float], list]:
    latencies, failures = [], []

    def loop() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            try:
                status, body, took = call(url, "POST", "/predict", {"texts": [texts[rng.integers(len(texts))]]})
            except OSError as exc:
                failures.append(str(exc))
            else:
                (latencies if status == 200 else failures).append(took if status == 200 else status)
            time.sleep(pace_s)

    thread = threading.Thread(target=loop)
    thread.start()
    return latencies, failures, thread


def _ms(values: list[float]) -> str:
    if not values:
        return "– | – | –"
    a = np.array(values) * 1000
    return f"{np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | {a.max():.0f}"


def _p99(values: list[float]) -> float:
    return float(np.percentile(np.array(values) * 1000, 99)) if values else float("nan")


class SlowClients:
    """`n` connections that send a request line and then one byte every ``DRIP_EVERY_S``; one the
    server closed is counted and opened again (so `n` stay open, as an attacker would keep them)."""

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.closed_by_server = 0
        self.stop = threading.Event()
        self.sockets = [self._open() for _ in range(n)]
        self.thread = threading.Thread(target=self._drip)
        self.thread.start()

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        s.setblocking(False)
        return s

    def _drip(self) -> None:
        while not self.stop.wait(DRIP_EVERY_S):
            for i, s in enumerate(self.sockets):
                try:
                    if s.recv(4096) == b"":
                        raise ConnectionResetError
                except BlockingIOError:  # still open, nothing said
                    try:
                        s.send(b"x")
                        continue
                    except OSError:
                        pass
                except OSError:
                    pass
                self.closed_by_server += 1
                s.close()
                try:
                    self.sockets[i] = self._open()
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.sockets:
            s.close()


def slow(url: str, port: int, tests: list[str], args, call) -> None:
    window = args.slow_seconds / args.rounds
    print(f"\n## A client predicting every {args.pace_ms:g} ms beside {args.slow} slow connections (a request line, "
          f"then one byte every {DRIP_EVERY_S:g} s), {args.rounds} alternating windows of {window:g} s\n")
    print("| run | predicts | p50 ms | p99 | max | failed | predict p99 / without | slow connections closed by the server |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    without, beside, failed = [], [], [0, 0]
    closed = 0
    for _ in range(args.rounds):
        for side, out in ((0, without), (1, beside)):
            clients = SlowClients(port, args.slow) if side else None
            stop = threading.Event()
            latencies, failures, thread = _predictor(url, tests, args.pace_ms / 1000, stop, call)
            time.sleep(window)
            stop.set()
            thread.join()
            out += latencies
            failed[side] += len(failures)
            if clients is not None:
                clients.close()
                closed += clients.closed_by_server
    print(f"| without | {len(without)} | {_ms(without)} | {failed[0]} | 1.00 | |")
    print(f"| beside {args.slow} slow connections | {len(beside)} | {_ms(beside)} | {failed[1]} | "
          f"{_p99(beside) / _p99(without):.2f} | {closed} |", flush=True)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 1/100 s


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def burst(url: str, pid: int, tests: list[str], label: str, args, call) -> None:
    print(f"\n## {args.burst_writes} writes (POST /labels/{{name}}/examples) in {args.burst_seconds:g} s beside a client "
          f"predicting every {args.pace_ms:g} ms, then {args.after_seconds:g} s of quiet\n")
    head0 = call(url, "GET", "/healthz")[1]["head"]
    stop = threading.Event()
    latencies, failures, thread = _predictor(url, tests, args.pace_ms / 1000, stop, call)
    time.sleep(args.burst_seconds)
    idle = list(latencies)
    del latencies[:]
    most_threads = _threads(pid)
    writes, every = [], args.burst_seconds / args.burst_writes
    start = time.perf_counter()
    for k in range(args.burst_writes):
        time.sleep(max(0.0, start + k * every - time.perf_counter()))
        status, body, took = call(url, "POST", f"/labels/{label}/examples", {"examples": [f"one more example {k}"]})
        if status != 200:
            raise RuntimeError(f"write answered {status}: {body}")
        writes.append(took)
        most_threads = max(most_threads, _threads(pid))
    during = list(latencies)
    del latencies[:]
    cpu0, last = _cpu_seconds(pid), time.perf_counter()
    trained_after = None
    while time.perf_counter() - last < args.after_seconds:
        most_threads = max(most_threads, _threads(pid))
        head = call(url, "GET", "/healthz")[1]["head"]
        if trained_after is None and head["imprinted"] == 0 and not head["refreshing"]:
            trained_after = time.perf_counter() - last
        time.sleep(0.1)
    cpu_after = _cpu_seconds(pid) - cpu0
    stop.set()
    thread.join()
    after = list(latencies)
    head = call(url, "GET", "/healthz")[1]["head"]
    refresh_cpu = head.get("last_seconds") or float("nan")
    print("| window | predicts | p50 ms | p99 | max | failed | predict p99 / without |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| without writes | {len(idle)} | {_ms(idle)} | 0 | 1.00 |")
    print(f"| during the burst | {len(during)} | {_ms(during)} | {len(failures)} | {_p99(during) / _p99(idle):.2f} |")
    print(f"| {args.after_seconds:g} s after it | {len(after)} | {_ms(after)} | | {_p99(after) / _p99(idle):.2f} |\n")
    print("| measure | value |\n|---|---:|")
    print(f"| writes acknowledged, p50 / p99 / max ms | {len(writes)}, {_ms(writes).replace(' |', ' /')} |")
    print(f"| head refreshes run (burst and after) | {head['refreshes'] - head0['refreshes']} |")
    print(f"| server CPU seconds in the {args.after_seconds:g} s after the last write | {cpu_after:.1f} |")
    print(f"| one refresh of this model, seconds (the last) | {refresh_cpu:.1f} |")
    print(f"| CPU after the burst / one refresh | {cpu_after / refresh_cpu:.1f} |")
    print(f"| seconds from the last write until the newest version was trained | "
          f"{'not within the window' if trained_after is None else f'{trained_after:.1f}'} |")
    print(f"| most server threads | {most_threads} |", flush=True)
