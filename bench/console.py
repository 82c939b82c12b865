"""Page times of the label console (``dyntc serve``'s pages) on a large label set.

Builds a model of ``--labels`` labels with ``--per-label`` examples each (synthetic texts, the hashing
encoder, ``head=None``: page times do not depend on the encoder), commits ``--edits`` further versions
(examples added, a rename), serves it with a ``dyntc serve`` subprocess (with a token, as a console
that can write) and times each page:

- ``server``: the HTTP response, first request after start (``cold``: the per-version caches are
  empty) and median / p95 / max over ``--repeat`` requests;
- ``browser``: with Debian's Chromium (when installed), the whole page in a headless browser
  (navigation start to the load event: HTML, style sheet and script), median over ``--browser-repeat``
  loads.

The console's goal is every page under 1 s on 2 cores; the last column is the worst time over it.

    .venv/bin/python -m bench.console            # 500 labels x 100 examples = 50,000 examples
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from bench._machine import cpu_model, load_average

GOAL_MS = 1000.0
WORDS = ("account card order parcel refund flight hotel alarm timer weather music song bill rent money "
         "transfer balance password login email phone address delivery return size colour price stock "
         "meeting calendar reminder note recipe restaurant table booking taxi train ticket seat bag").split()
VERBS = "check change cancel book find show send track update open close reset add remove explain".split()


def texts_for(label: int, n: int, rng: random.Random) -> list[str]:
    topic = [WORDS[(label * 7 + k) % len(WORDS)] for k in range(3)]
    return [f"please {rng.choice(VERBS)} my {rng.choice(topic)} {rng.choice(WORDS)} number {label}-{i}"
            for i in range(n)]


def build(path: Path, labels: int, per_label: int, edits: int) -> dict:
    from dyntc import DynamicClassifier

    rng = random.Random(0)
    texts, names = [], []
    for j in range(labels):
        texts += texts_for(j, per_label, rng)
        names += [f"intent_{j:03d}"] * per_label
    start = time.perf_counter()
    DynamicClassifier(encoder="hashing", head=None).fit(texts, names).save(path)
    for k in range(edits):
        with DynamicClassifier.edit(path) as clf:
            if k == edits - 1:
                clf.rename_label("intent_000", "intent_000_renamed")
            else:
                clf.add_examples(f"intent_{k * 7 % labels:03d}", [f"one more example {k} {w}" for w in WORDS[:5]])
    return {"seconds": time.perf_counter() - start, "examples": len(texts)}


def get_ms(url: str, token: str) -> float:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return (time.perf_counter() - start) * 1000


def browser_ms(urls: list[str], repeat: int) -> dict[str, float] | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    try:
        from _browser import missing, start_browser, stop_browser
    except ImportError:
        return None
    if missing():
        return None
    driver = start_browser()
    try:
        out = {}
        for url in urls:
            times = []
            for _ in range(repeat + 1):  # the first load warms the browser's cache of the script and style
                driver.get(url)
                times.append(driver.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime;"))
            out[url] = statistics.median(times[1:])
        return out
    finally:
        stop_browser(driver)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=int, default=500)
    ap.add_argument("--per-label", type=int, default=100)
    ap.add_argument("--edits", type=int, default=20, help="versions committed after the first")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--browser-repeat", type=int, default=5)
    args = ap.parse_args()
    token = "bench-console-token-0123456789"
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        built = build(model, args.labels, args.per_label, args.edits)
        (Path(tmp) / "token").write_text(token)
        (Path(tmp) / "token").chmod(0o600)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "dyntc", "serve", str(model), "--port", str(port),
                                 "--token-file", str(Path(tmp) / "token")], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 300
            while True:
                try:
                    get_ms(base + "/healthz", token)
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError(proc.stderr.read().decode()[-2000:])
                    time.sleep(0.2)
            head = args.edits + 1
            from dyntc.classifier.service.console import LABELS_PER_PAGE

            last = -(-args.labels // LABELS_PER_PAGE)
            pages = {
                f"labels list (page 1 of {last})": "/",
                f"labels list (page {last})": f"/?page={last}",
                "labels search (q=intent_04)": "/?q=intent_04",
                f"label page ({args.per_label} examples)": f"/console/labels/intent_{args.labels // 2:03d}",
                f"split page ({args.per_label} examples)": f"/console/labels/intent_{args.labels // 2:03d}/split",
                "versions": "/console/versions",
                f"difference 1 -> {head}": f"/console/versions/diff?a=1&b={head}",
                "try it": "/console/try",
            }
            rows = []
            for name, path in pages.items():
                cold = get_ms(base + path, token)
                times = sorted(get_ms(base + path, token) for _ in range(args.repeat))
                rows.append((name, path, cold, statistics.median(times), times[int(0.95 * (len(times) - 1))], times[-1]))
            shown = browser_ms([base + "/", base + f"/console/labels/intent_{args.labels // 2:03d}", base + "/console/versions"],
                               args.browser_repeat)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"# bench.console  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  CPU: {cpu_model()}  "
          f"cores: {os.cpu_count()}  load average: {load_average()}")
    print(f"# model: {args.labels} labels, {built['examples']:,} examples (+{args.edits} versions; built in "
          f"{built['seconds']:.0f} s), hashing encoder, head=None; {args.repeat} requests per page")
    print()
    print(f"| page | server cold ms | server median ms | p95 ms | max ms | max / {GOAL_MS:.0f} ms goal |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _, cold, med, p95, worst in rows:
        print(f"| {name} | {cold:.0f} | {med:.1f} | {p95:.1f} | {worst:.1f} | {max(cold, worst) / GOAL_MS:.2f} |")
    if shown:
        print()
        print("| page in headless Chromium (load event) | median ms | / goal |")
        print("|---|---:|---:|")
        for url, ms in shown.items():
            print(f"| {url.split(str(port))[1]} | {ms:.0f} | {ms / GOAL_MS:.2f} |")
    else:
        print("\n(no browser timing: chromium and chromium-driver are not installed)")


if __name__ == "__main__":
    main()
