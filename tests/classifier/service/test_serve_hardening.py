"""`dyntc serve` under hostile or careless clients: limits, cross-site writes, slow clients, bad bytes,
lock-holding processes, a store that disappears. Real uvicorn processes on 127.0.0.1; loopback only,
every loop bounded."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from _server import TOKEN, Server, eventually

from dyntc import DynamicClassifier, DyntcError

pytest.importorskip("fastapi")

LIMITS = ["--max-body-bytes", "20000", "--max-text-chars", "300", "--max-examples", "50", "--max-label-chars", "40",
          "--request-timeout-s", "1.5"]


@pytest.fixture(scope="module")
def open_server(fitted, tmp_path_factory):
    """No token: loopback only, writes from local non-browser clients."""
    with Server.serving(fitted, tmp_path_factory.mktemp("open"), token=None, args=LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def guarded(fitted, tmp_path_factory):
    """A write token and a read token."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "read").write_text("reader-secret-0123456789")
    (tmp / "read").chmod(0o600)
    srv = Server(fitted.save(tmp / "model"), tmp, args=[*LIMITS, "--read-token-file", str(tmp / "read")])
    yield srv
    srv.stop()


def version(srv) -> int:
    return srv.call("GET", "/labels", token=srv.token)[1]["version"]


def raw_request(srv, data: bytes, read_for: float = 5.0) -> bytes:
    """Send `data` as it is on one connection; what comes back until the server closes (or `read_for` s)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=read_for) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


# ------------------------------------------------------------------------------ 1. bounded requests


def test_oversized_requests_get_413_before_parsing(open_server):
    before = version(open_server)
    big = json.dumps({"texts": ["x" * 100] * 300}).encode()  # 30 kB > 20,000 bytes
    status, body = open_server.call("POST", "/predict", raw=big, token=None)
    assert status == 413 and "--max-body-bytes" in body["error"]
    # A declared length over the limit is refused without reading a byte of the body.
    answer = raw_request(open_server, b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      b"Content-Length: 999999999\r\n\r\n{")
    assert answer.startswith(b"HTTP/1.1 413") and b"max-body-bytes" in answer
    # A chunked body (no length) is counted as it arrives.
    chunk = b"[" + b'"aaaa",' * 4000
    answer = raw_request(open_server, b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 413")
    status, body = open_server.call("POST", "/predict", {"texts": ["y" * 301]}, token=None)
    assert status == 413 and "texts[0] has 301 characters" in body["error"] and "--max-text-chars" in body["error"]
    status, body = open_server.call("POST", "/labels", {"name": "many", "examples": ["an example"] * 51}, token=None)
    assert status == 413 and "--max-examples" in body["error"]
    assert version(open_server) == before


def test_a_large_request_leaves_a_worker_for_small_ones():
    """Two workers: large requests take at most one, so a small one never waits behind them."""
    from dyntc.classifier.service.limits import SMALL_REQUEST_CHARS, EmbeddingWorkers

    workers = EmbeddingWorkers(2)
    entered, release = threading.Event(), threading.Event()
    second_large_in = threading.Event()

    def large(flag):
        with workers.take(SMALL_REQUEST_CHARS + 1):
            flag.set()
            release.wait(10)

    first = threading.Thread(target=large, args=(entered,))
    second = threading.Thread(target=large, args=(second_large_in,))
    first.start()
    assert entered.wait(5)
    second.start()
    assert not second_large_in.wait(0.3)  # the second large request queues...
    small_done = threading.Event()

    def small():
        with workers.take(10):
            small_done.set()

    threading.Thread(target=small).start()
    assert small_done.wait(5)  # ...the small one does not
    release.set()
    first.join(10)
    second.join(10)
    assert second_large_in.is_set()


# ------------------------------------------------------------------------------ 2. cross-site writes


def test_without_a_token_cross_site_writes_are_refused(open_server):
    before = version(open_server)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, body = open_server.call("POST", "/versions/1/restore", raw=b"", token=None, headers=form)
    assert status == 415 and "application/json" in body["error"]
    status, body = open_server.call("POST", "/labels", {"name": "evil", "examples": ["x"]}, token=None,
                                    headers={"Origin": "http://evil.example"})
    assert status == 403 and "evil.example" in body["error"]
    status, body = open_server.call("POST", "/labels", {"name": "evil", "examples": ["x"]}, token=None,
                                    headers={"Origin": "null"})  # a sandboxed page
    assert status == 403
    status, body = open_server.call("POST", "/labels", {"name": "evil", "examples": ["x"]}, token=None,
                                    headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own name as Host.
    answer = raw_request(open_server, b"GET /labels HTTP/1.1\r\nHost: evil.example:80\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403") and b"loopback" in answer
    assert version(open_server) == before
    # A local client (JSON body type, same-origin or no Origin) may write.
    status, _ = open_server.call("POST", "/labels", {"name": "local", "examples": ["from a local script"]}, token=None,
                                 headers={"Origin": f"http://127.0.0.1:{open_server.port}"})
    assert status == 201
    assert open_server.call("POST", "/versions/1/restore", {}, token=None)[0] == 200


def test_non_loopback_without_token_refused_and_weak_tokens_refused(fitted, tmp_path):
    model = fitted.save(tmp_path / "model")

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "dyntc", "serve", str(model), "--port", "9", *args],
                              capture_output=True, text=True, timeout=120)

    run = serve("--host", "0.0.0.0")
    assert run.returncode == 2 and "--token-file" in run.stderr and "--insecure" in run.stderr
    (tmp_path / "short").write_text("abc")
    (tmp_path / "short").chmod(0o600)
    run = serve("--token-file", str(tmp_path / "short"))
    assert run.returncode == 2 and "at least 16 characters" in run.stderr
    (tmp_path / "public").write_text("a-long-enough-token-0123456789")
    (tmp_path / "public").chmod(0o644)
    run = serve("--token-file", str(tmp_path / "public"))
    assert run.returncode == 2 and "chmod 600" in run.stderr
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00\x81" * 8)
    (tmp_path / "binary").chmod(0o600)
    run = serve("--token-file", str(tmp_path / "binary"))
    assert run.returncode == 2 and "not UTF-8" in run.stderr and "Traceback" not in run.stderr


def test_read_token_protects_reads(guarded):
    for path in ("/labels", "/versions"):
        assert guarded.call("GET", path, token=None)[0] == 401
        assert guarded.call("GET", path, token="reader-secret-0123456789")[0] == 200
        assert guarded.call("GET", path, token=TOKEN)[0] == 200  # the write token reads too
    assert guarded.call("POST", "/predict", {"texts": ["hi"]}, token=None)[0] == 401
    assert guarded.call("POST", "/labels", {"name": "x", "examples": ["y"]}, token="reader-secret-0123456789")[0] == 401
    assert guarded.call("GET", "/healthz", token=None)[0] == 200


# ------------------------------------------------------------------------------ 3. readers and writers


HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def test_reads_answer_while_another_process_holds_the_write_lock(fitted, tmp_path):
    srv = Server(fitted.save(tmp_path / "model"), tmp_path)
    try:
        # Another process commits a version first, so the service must reload while the lock is held.
        subprocess.run([sys.executable, "-m", "dyntc", "labels", "add", str(srv.model), "from_cli", "-e", "cli text"],
                       check=True, capture_output=True, timeout=120)
        assert eventually(lambda: "from_cli" in srv.call("GET", "/labels", token=None)[1]["labels"])
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(srv.model / "dyntc.sqlite"), "8"],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "locked"
        results = {}
        writer = threading.Thread(target=lambda: results.setdefault(
            "write", srv.call("POST", "/labels", {"name": "queued", "examples": ["waits for the lock"]})))
        writer.start()  # an HTTP write now waits for the lock holder...
        time.sleep(0.5)
        for _ in range(5):  # ...while reads answer, with the version the CLI committed
            status, body = srv.call("POST", "/predict", {"texts": ["wake me up"]}, token=None)
            assert status == 200 and "from_cli" in body["labels"]
            assert srv.call("GET", "/labels", token=None)[0] == 200
        assert holder.poll() is None, "the reads above must not have waited for the lock to be released"
        holder.wait(30)
        writer.join(60)
        assert results["write"][0] == 201 and {"from_cli", "queued"} <= set(results["write"][1]["labels"])
    finally:
        srv.stop()


def test_cli_writer_started_under_a_held_lock_lands_beside_another(fitted, tmp_path):
    """`dyntc labels add` started while another process holds the lock: it loads and embeds meanwhile,
    then commits once the lock is free, on top of a version committed in between."""
    model = fitted.save(tmp_path / "model")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(model / "dyntc.sqlite"), "3"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    cli = subprocess.Popen([sys.executable, "-m", "dyntc", "labels", "add", str(model), "late", "-e", "a late label"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    holder.wait(30)
    with DynamicClassifier.edit(model) as clf:  # commits between the CLI's load and its commit, or after it
        clf.add_label("other", ["another writer"])
    assert cli.wait(120) == 0, cli.stderr.read()
    assert {"late", "other"} <= set(DynamicClassifier.load(model).classes_)


def test_edit_replays_on_a_moved_head(fitted, tmp_path):
    model = fitted.save(tmp_path / "model")
    with DynamicClassifier.edit(model) as clf:
        clf.add_label("mine", ["my example"])
        clf.rename_label("timer", "countdown")
        other = DynamicClassifier.load(model)
        other.add_label("theirs", ["their example"])
        other.save(model)  # commits version 2 while this block runs
    assert clf.version_ == 3 and {"mine", "theirs", "countdown"} <= set(clf.classes_) and "timer" not in clf.classes_
    assert set(DynamicClassifier.load(model).classes_) == set(clf.classes_)
    with pytest.raises(DyntcError, match="already exists"):  # a replay that no longer applies fails loudly
        with DynamicClassifier.edit(model) as clf:
            clf.add_label("clash", ["x"])
            other = DynamicClassifier.load(model)
            other.add_label("clash", ["y"])
            other.save(model)
    assert DynamicClassifier.load(model).support("clash") == ["y"]


# ------------------------------------------------------------------------------ 4. no disk growth from requests


def test_predictions_write_no_disk_cache(tmp_path):
    pytest.importorskip("sentence_transformers")
    texts = [f"please set an alarm for {h} o'clock" for h in range(12)] + [f"what is my balance in account {i}" for i in range(12)]
    labels = ["alarm"] * 12 + ["balance"] * 12
    cache = tmp_path / "cache"
    model = DynamicClassifier(encoder_options={"cache": False}).fit(texts, labels).save(tmp_path / "model")
    srv = Server(model, tmp_path, max_batch=256, env={"DYNTC_CACHE": str(cache)})
    try:
        for round_ in range(3):
            batch = [f"request {round_} number {i} about my alarm" for i in range(100)]
            assert srv.call("POST", "/predict", {"texts": batch}, token=None)[0] == 200
        assert srv.call("POST", "/labels", {"name": "greet", "examples": [f"hello {i}" for i in range(80)]})[0] == 201
    finally:
        srv.stop()
    written = [p for p in cache.rglob("*") if p.is_file() and p.suffix == ".npy"] if cache.exists() else []
    assert written == []


def test_memory_cache_is_bounded_in_bytes():
    import torch

    from dyntc.core.encoders.pretrained import EmbeddingCache

    cache = EmbeddingCache(max_bytes=100_000)
    for i in range(1000):
        cache.put(f"text {i} " + "x" * 500, torch.zeros(384))
    assert cache.nbytes <= 100_000 and 0 < len(cache) < 1000
    assert cache.get("text 999 " + "x" * 500) is not None and cache.get("text 0 " + "x" * 500) is None


_CACHE_MEMORY = """
import gc, sys, torch
from dyntc.core.encoders.pretrained import EmbeddingCache
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
cache, n = EmbeddingCache(max_bytes=1 << 40), 20_000
gc.collect(); before = rss()
for start in range(0, n, 64):  # as the backbone gives them: rows of a batch, each cloned
    fresh = torch.randn(64, 384)
    for i in range(64):
        cache.put(f"text {start + i} " + "x" * int(sys.argv[1]), fresh[i].clone())
del fresh; gc.collect()
print(cache.nbytes / (rss() - before))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory read from /proc (Linux)")
@pytest.mark.parametrize("chars", [10, 400])
def test_memory_cache_counts_what_it_takes_in_resident_memory(chars):
    """The bytes the cache counts are the resident memory its entries take (within 12 %), so its
    256 MiB bound is one on the process's memory; in a fresh process, so no freed memory is reused."""
    done = subprocess.run([sys.executable, "-c", _CACHE_MEMORY, str(chars)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert 0.88 <= float(done.stdout) <= 1.12, done.stdout


# ------------------------------------------------------------------------------ 7./8. bad text and names


def test_lone_surrogates_and_bad_names_are_4xx(open_server):
    before = version(open_server)
    surrogate = b'"\\ud800"'
    cases = [
        (b'{"texts": [' + surrogate + b"]}", "/predict", 400, "lone surrogate"),
        (b'{"name": "ok", "examples": [' + surrogate + b"]}", "/labels", 400, "lone surrogate"),
        (b'{"name": ' + surrogate + b', "examples": ["x"]}', "/labels", 400, "lone surrogate"),
        (b'{"to": ' + surrogate + b"}", "/labels/alarm/rename", 400, "lone surrogate"),
        (json.dumps({"name": "a\u0000b", "examples": ["x"]}).encode(), "/labels", 400, "control characters"),
        (json.dumps({"name": "a/b", "examples": ["x"]}).encode(), "/labels", 400, "'/'"),
        (json.dumps({"name": "n" * 41, "examples": ["x"]}).encode(), "/labels", 413, "--max-label-chars"),
        (json.dumps({"to": "n" * 41}).encode(), "/labels/alarm/rename", 413, "--max-label-chars"),
    ]
    for raw, path, status, words in cases:
        got, body = open_server.call("POST", path, raw=raw, token=None)
        assert (got, words in body.get("error", "")) == (status, True), (raw[:60], got, body)
    got, body = open_server.call("GET", "/versions?limit=" + "9" * 31, token=None)
    assert got == 400 and "limit" in body["error"]
    assert version(open_server) == before


# ------------------------------------------------------------------------------ 9. codes and messages


def test_wrong_types_unknown_routes_and_slow_clients(open_server):
    for body in ({"texts": ["a"], "top_k": True}, {"texts": ["a"], "proba": "yes"}, {"texts": ["a"], "reject": 1}):
        status, answer = open_server.call("POST", "/predict", body, token=None)
        assert status == 422 and "error" in answer, (body, answer)
    status, answer = open_server.call("GET", "/no/such/endpoint", token=None)
    assert status == 404 and "no such endpoint" in answer["error"] and "detail" not in answer
    status, answer = open_server.call("DELETE", "/predict", token=None)
    assert status == 405 and "not allowed" in answer["error"]
    # Half-sent requests are closed after --request-timeout-s (1.5 s here): headers, then a body.
    started = time.time()
    sockets = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", open_server.port), timeout=10)
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its headers
        sockets.append(s)
    for s in sockets:
        assert s.recv(1024) == b""  # closed by the server
        s.close()
    assert time.time() - started < 9
    answer = raw_request(open_server, b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      b"Content-Length: 100\r\n\r\n{\"texts\"")
    assert answer.startswith(b"HTTP/1.1 408")
    assert open_server.call("GET", "/healthz", token=None)[0] == 200


def test_store_gone_reads_answer_from_memory_writes_503_health_degraded(fitted, tmp_path):
    srv = Server(fitted.save(tmp_path / "model"), tmp_path)
    try:
        assert srv.call("GET", "/healthz")[1]["status"] == "ok"
        served = srv.call("GET", "/labels")[1]["version"]
        moved = tmp_path / "elsewhere"
        os.rename(srv.model, moved)
        status, body = srv.call("POST", "/predict", {"texts": ["wake me up"]})
        assert status == 200 and body["version"] == served  # from memory
        health = eventually(lambda: (b := srv.call("GET", "/healthz"))[1]["status"] == "degraded" and b)
        assert health[0] == 200 and health[1]["version"] == served and "gone or unreadable" in health[1]["error"]
        status, body = srv.call("POST", "/labels", {"name": "while_away", "examples": ["x"]})
        assert status == 503 and "gone or unreadable" in body["error"]
        os.rename(moved, srv.model)
        assert eventually(lambda: srv.call("GET", "/healthz")[1]["status"] == "ok")
        assert srv.call("POST", "/labels", {"name": "back", "examples": ["x"]})[0] == 201
    finally:
        srv.stop()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (needs root and mount rights; CI has both)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({done.stderr.strip()})")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_is_507_and_changes_nothing(fitted, small_disk, tmp_path):
    model = fitted.save(small_disk / "model")
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave about 60 kB free
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        f.write(b"\0" * max(0, free - 60_000))
    srv = Server(model, tmp_path)
    try:
        before = srv.call("GET", "/labels")[1]
        examples = [f"example number {i} " + "padding " * 30 for i in range(1000)]
        status, body = srv.call("POST", "/labels", {"name": "huge", "examples": examples})
        assert status == 507 and "disk" in body["error"] and "full" in body["error"], (status, body)
        assert srv.call("GET", "/labels")[1] == before
        filler.unlink()  # space again: the same write now lands
        assert srv.call("POST", "/labels", {"name": "huge", "examples": examples})[0] == 201
    finally:
        srv.stop()
