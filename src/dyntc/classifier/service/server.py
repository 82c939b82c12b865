"""Running ``dyntc serve``: tokens read, the listening address checked, uvicorn started."""

from __future__ import annotations

import copy
import logging
import sys
import warnings
from pathlib import Path

from dyntc.classifier.service.access import Access, is_loopback, read_token
from dyntc.classifier.service.app import create_app
from dyntc.classifier.service.inbox import CapturePolicy
from dyntc.classifier.service.limits import Limits, guarded_h11
from dyntc.errors import DyntcError


def run(model_dir: str | Path, host: str, port: int, *, token_file: Path | None = None, read_token_file: Path | None = None,
        insecure: bool = False, limits: Limits = Limits(), capture: CapturePolicy = CapturePolicy(),
        access_log: bool = False) -> None:
    """Serve until interrupted (the ``dyntc serve`` command): prints ``listening on http://HOST:PORT``
    on stderr once the socket is bound; with `access_log`, one line per request."""
    import torch
    import uvicorn

    write_token = None if token_file is None else read_token(token_file)
    reads = None if read_token_file is None else read_token(read_token_file, "read token file")
    loopback = is_loopback(host)
    if capture.capture and write_token is None:
        raise DyntcError("--capture needs --token-file: captured texts are readable only with the token")
    if not loopback and write_token is None:
        if not insecure:
            raise DyntcError(f"--host {host} is reachable from other machines, and without --token-file anyone there "
                             "could change the model: give --token-file (or --insecure to accept that)")
        warnings.warn(f"dyntc serve: listening on {host} with no token (--insecure): anyone who can reach it can "
                      "change or roll back the model", stacklevel=2)
    torch.set_num_threads(1)  # one thread per embedding worker (EmbeddingWorkers): no oversubscription
    app = create_app(model_dir, limits=limits, access=Access(write_token, reads, loopback), capture=capture)
    _allow_open_files(limits.max_connections + 256)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=guarded_h11(limits),
                            timeout_keep_alive=5, backlog=max(2048, limits.max_connections), access_log=access_log,
                            log_config=_log_config())
    if access_log:  # log_level set every uvicorn logger to warnings: the access lines are at info
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    _announcing_server(config).run()


def _log_config() -> dict:
    """uvicorn's logging, its access lines on stderr as well (stdout is left to the application)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _announcing_server(config):
    """uvicorn's server, saying where it listens once its socket is bound (uvicorn's own line is at
    info level, which would also bring its per-connection chatter)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = [s.getsockname() for server in self.servers for s in server.sockets]
                port = bound[0][1] if bound else config.port
                print(f"listening on {_url(config.host, port)} (Ctrl+C to stop)", file=sys.stderr, flush=True)

    return Server(config)


def _allow_open_files(n: int) -> None:
    """Raise this process's open-file limit towards `n` (as far as the hard limit allows): every
    connection is a file descriptor, and the default soft limit (often 1024) is below
    ``max_connections`` plus the store's and the model's files."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n if hard == resource.RLIM_INFINITY else min(n, hard), hard))
