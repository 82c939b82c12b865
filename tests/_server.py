"""A real ``dyntc serve`` process on 127.0.0.1 for the tests, and a stdlib HTTP client."""

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TOKEN = "s3cret-token-0123456789"
# What a client sees when the server dies mid-request: refused/reset, or cut off after the headers.
SERVER_GONE = (OSError, http.client.HTTPException)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, tmp_path, max_batch=8, token=TOKEN, args=(), env=None):
        self.model, self.port, self.token = model, _free_port(), token
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "dyntc", "serve", str(model), "--port", str(self.port),
                     "--max-batch", str(max_batch), *args]
        if token is not None:
            (tmp_path / "token").write_text(token + "\n")
            (tmp_path / "token").chmod(0o600)
            self.args += ["--token-file", str(tmp_path / "token")]
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.start()

    def start(self):
        env = self.env
        self.proc = subprocess.Popen(self.args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()}")
            try:
                if self.call("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not start in 120 s")

    def call(self, method, path, body=None, token=TOKEN, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        for name, value in ({"Content-Type": "application/json"} | (headers or {})).items():
            if value is not None:
                req.add_header(name, value)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                return err.code, json.loads(body)
            except ValueError:  # not one of the service's JSON errors (e.g. the server's own 500 page)
                return err.code, {"non_json_body": body.decode(errors="replace")}

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    @classmethod
    @contextlib.contextmanager
    def serving(cls, classifier, tmp_path, **options):
        """A server of `classifier` saved as tmp_path/model (`options` as the constructor's), stopped
        on leaving."""
        server = cls(classifier.save(tmp_path / "model"), tmp_path, **options)
        try:
            yield server
        finally:
            server.stop()


def eventually(check, timeout: float = 10.0, every: float = 0.1):
    """`check()` once it is truthy (a version committed elsewhere is served within moments, not at
    once: the service loads it in the background); its last value after `timeout` seconds."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value or time.time() > deadline:
            return value
        time.sleep(every)
