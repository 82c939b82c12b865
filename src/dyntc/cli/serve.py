"""``dyntc serve``: the HTTP service (:mod:`dyntc.serve`) on a model directory written by ``dyntc fit``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError


def serve(
    model: Annotated[Path, typer.Argument(help="Model directory written by `dyntc fit`")],
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8080,
    token_file: Annotated[Optional[Path], typer.Option(help="File holding the bearer token that write endpoints require")] = None,
    max_batch: Annotated[int, typer.Option(help="Most texts one /predict request may send")] = 256,
) -> None:
    """Serve predictions and live label changes over HTTP (JSON; OpenAPI document at /docs)."""
    from dyntc.serve import run

    if not 0 < port < 65536:
        raise DyntcError(f"--port must be in 1..65535, got {port}")
    if max_batch < 1:
        raise DyntcError(f"--max-batch must be >= 1, got {max_batch}")
    run(model, host, port, token_file, max_batch)
