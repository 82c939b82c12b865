"""Progress bars on the steps that take seconds to minutes (embedding texts, training episodes).

Embedding bars are off unless the caller turns them on for a block (:func:`showing`; the ``dyntc``
command does, on a terminal): a library call or a service thread prints nothing. The setting is a
context variable, so a thread of the HTTP service never inherits a command's bars.
"""

from __future__ import annotations

import contextvars
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

#: Below this many texts an embedding pass takes well under a second: no bar.
MIN_TEXTS = 512

_SHOW: contextvars.ContextVar[bool] = contextvars.ContextVar("dyntc_progress", default=False)


@contextmanager
def showing(on: bool = True) -> Iterator[None]:
    """Embedding bars on (or off) within the block, in this thread."""
    token = _SHOW.set(on)
    try:
        yield
    finally:
        _SHOW.reset(token)


def shown() -> bool:
    """Whether embedding bars are on here (:func:`showing`)."""
    return _SHOW.get()


def embedding_bar(total: int, desc: str = "embedding") -> tqdm:
    """A bar over `total` texts on stderr, disabled unless :func:`showing` is on and the pass is long."""
    return tqdm(total=total, desc=desc, unit="text", unit_scale=True, leave=False, file=sys.stderr,
                disable=not _SHOW.get() or total < MIN_TEXTS)


def budget_total(step: int, first: int, max_steps: int, elapsed_s: float, loop_s: float, budget_s: float | None) -> int:
    """The steps a loop will run, for its bar's total (and so its ETA): `max_steps`, or fewer when the
    time budget ends the loop first at the rate seen so far.

    `step`: the last step done; `first`: the first step of this run (a resumed loop starts later);
    `elapsed_s`: seconds counted against the budget (a resumed run's earlier time included);
    `loop_s`: seconds this run's loop has taken for its ``step - first + 1`` steps."""
    if budget_s is None or loop_s <= 0:
        return max_steps
    rate = (step - first + 1) / loop_s
    reachable = step + math.ceil(rate * max(budget_s - elapsed_s, 0.0))
    return max(step, min(max_steps, reachable))
