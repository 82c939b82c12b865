"""``dyntc serve``: the HTTP service (:mod:`dyntc.classifier.service`) on a model directory written by ``dyntc fit``,
or on a model in PostgreSQL that several replicas share (docs/deployment.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError

# The limits' defaults are declared once, in dyntc.classifier.service.limits.Limits; importing it here would load torch
# for every CLI command, so the options take None and fall back to those defaults.


def serve(
    model: Annotated[str, typer.Argument(help="Model directory written by `dyntc fit`, or a "
                                              "postgresql://[user@]host[:port]/db?model=NAME URL shared by replicas")],
    host: Annotated[str, typer.Option(help="Address to listen on (not loopback: needs --token-file or --insecure)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8080,
    token_file: Annotated[Optional[Path], typer.Option(help="Private file (chmod 600) holding the bearer token that writes need (>= 16 characters)")] = None,
    read_token_file: Annotated[Optional[Path], typer.Option(help="Private file holding a token that reads need too (the write token also reads)")] = None,
    insecure: Annotated[bool, typer.Option(help="Allow a non-loopback --host without --token-file (anyone who reaches it can change the model)")] = False,
    max_body_bytes: Annotated[Optional[int], typer.Option(help="Largest request body in bytes [default: 1048576]")] = None,
    max_batch: Annotated[Optional[int], typer.Option(help="Most texts in one /predict request [default: 256]")] = None,
    max_text_chars: Annotated[Optional[int], typer.Option(help="Longest text (characters) predicted or stored [default: 2000]")] = None,
    max_examples: Annotated[Optional[int], typer.Option(help="Most examples in one write [default: 1000]")] = None,
    max_label_chars: Annotated[Optional[int], typer.Option(help="Longest label name (characters) [default: 100]")] = None,
    request_timeout_s: Annotated[Optional[float], typer.Option(help="Seconds a client has to send its request, headers and body in all [default: 30]")] = None,
    max_connections: Annotated[Optional[int], typer.Option(help="Open connections; over it a new one closes the oldest not being worked on (idle or still sending) [default: 1024]")] = None,
    max_in_flight: Annotated[Optional[int], typer.Option(help="Requests worked on at once; more are answered 503 (/healthz always answered) [default: 128]")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Threads that embed at once (one reserved for small requests); 0 = CPU count [default: 0]")] = None,
    max_adapt_s: Annotated[Optional[float], typer.Option(help="Most seconds a discovery job (POST /discover with adapt_s) may fine-tune the backbone [default: 900]")] = None,
    access_log: Annotated[bool, typer.Option(help="Print one line per request on stderr (client, method, path, status)")] = False,
    capture: Annotated[Optional[int], typer.Option(help="Keep up to N predicted texts the service could not place (rejected or low-margin) in the model's store, for the console's inbox; needs --token-file [default: 0 = off]")] = None,
    capture_days: Annotated[Optional[float], typer.Option(help="Forget a captured text not seen again for this many days [default: 7]")] = None,
    capture_margin: Annotated[Optional[float], typer.Option(help="Capture a text whose two best labels' probabilities differ by less than this [default: 0.1]")] = None,
) -> None:
    """Serve predictions and live label changes over HTTP (JSON; OpenAPI document at /docs), with a label
    console for the browser at / ."""
    from dyntc.cli.common import missing_extra

    if not 0 < port < 65536:
        raise DyntcError(f"--port must be in 1..65535, got {port}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise missing_extra(exc.name, "`dyntc serve`") from None
    from dyntc.classifier.service.inbox import CapturePolicy
    from dyntc.classifier.service.limits import Limits
    from dyntc.classifier.service.server import run

    given = dict(max_body_bytes=max_body_bytes, max_batch=max_batch, max_text_chars=max_text_chars,
                 max_examples=max_examples, max_label_chars=max_label_chars, request_timeout_s=request_timeout_s,
                 max_connections=max_connections, max_in_flight=max_in_flight, workers=workers,
                 max_adapt_s=max_adapt_s)
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    captured = dict(capture=capture, capture_days=capture_days, capture_margin=capture_margin)
    policy = CapturePolicy(**{k: v for k, v in captured.items() if v is not None})
    run(model, host, port, token_file=token_file, read_token_file=read_token_file, insecure=insecure, limits=limits,
        capture=policy, access_log=access_log)
