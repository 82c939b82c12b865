"""Who may read and write through ``dyntc serve``: tokens, and the ``Origin`` / ``Host`` rules of a
service without a write token."""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import Request

from dyntc.classifier.service.limits import HTTPError
from dyntc.errors import DyntcError

MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Access:
    """Who may read and write.

    ``write_token``: the bearer token that writes need. ``read_token``: if set, reads need it (or the
    write token). ``loopback``: the service listens on a loopback address only; without a write
    token it must (``run`` refuses otherwise, unless ``insecure``), and then a write must carry a
    JSON ``Content-Type`` (a cross-site HTML form cannot send one, and a script needs a CORS
    preflight the service never grants) and no ``Origin`` or ``Sec-Fetch-Site`` of another site,
    and every request's ``Host`` must be a loopback name (DNS rebinding)."""

    write_token: str | None = None
    read_token: str | None = None
    loopback: bool = True

    def __post_init__(self) -> None:
        for name, token in (("write token", self.write_token), ("read token", self.read_token)):
            if token is not None:
                check_token(token, name)

    def host_refusal(self, host: str) -> str | None:
        """Why a request with this ``Host`` header is refused (None: it is not)."""
        if self.loopback and not is_loopback(_host_name(host)):
            return (f"Host {host[:80]!r} is not a loopback name; this service listens on loopback only "
                    "(a DNS rebinding guard)")
        return None

    def check_read(self, request: Request) -> None:
        """A FastAPI dependency of every read."""
        if self.read_token is None:
            return
        given = _bearer(request)
        if not (_same_token(given, self.read_token) or
                (self.write_token is not None and _same_token(given, self.write_token))):
            raise HTTPError(401, "this service's reads need a token: send 'Authorization: Bearer <token>'")

    def check_write(self, request: Request) -> None:
        """A FastAPI dependency of every write."""
        if self.write_token is not None:
            if not _same_token(_bearer(request), self.write_token):
                raise HTTPError(401, "this endpoint changes the model: send 'Authorization: Bearer <token>'")
            return
        # No token (loopback only): refuse what a web page in a browser on this host could send.
        origin = request.headers.get("origin")
        if origin is not None and not is_loopback(urlsplit(origin).hostname or ""):  # "null" too (sandboxed pages)
            raise HTTPError(403, f"a write from origin {origin[:80]!r} is refused: this service takes writes from "
                                 "local clients only (start it with --token-file to take writes from elsewhere)")
        if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            raise HTTPError(403, "a cross-site write is refused")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise HTTPError(415, "a write needs 'Content-Type: application/json' (a body of {} will do where none "
                                 "is needed)")


def is_loopback(host: str) -> bool:
    if host.strip("[]") in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The host part of a ``Host`` header (``127.0.0.1:8080``, ``[::1]:80``, ``localhost``)."""
    return (urlsplit(f"//{value}").hostname or "") if value else ""


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if value is None or not value.startswith("Bearer "):
        return None
    return value.removeprefix("Bearer ").strip()


def _same_token(given: str | None, token: str) -> bool:
    # bytes: compare_digest refuses non-ASCII str, which would turn a stranger's header into a 500
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8"))


def check_token(token: str, what: str = "token") -> str:
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise DyntcError(f"the {what} must be at least {MIN_TOKEN_CHARS} characters without spaces, got "
                         f"{len(token)} characters: make one with `openssl rand -hex 32 > token && chmod 600 token`")
    return token


def read_token(path: Path, what: str = "token file") -> str:
    """The secret in `path`, which must be a private UTF-8 text file (not readable by group or others)."""
    if path.is_dir():
        raise DyntcError(f"{what} {str(path)!r} is a directory: give the file that holds the token")
    if not path.is_file():
        raise DyntcError(f"{what} {str(path)!r} does not exist" if not path.exists() else
                         f"{what} {str(path)!r} is not a regular file: give the file that holds the token")
    if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise DyntcError(f"{what} {str(path)!r} can be read by other users (mode "
                         f"{stat.S_IMODE(path.stat().st_mode):o}): run `chmod 600 {path}`")
    try:
        token = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise DyntcError(f"{what} {str(path)!r} is not UTF-8 text: put the secret in it as text") from None
    return check_token(token, what.removesuffix(" file"))
