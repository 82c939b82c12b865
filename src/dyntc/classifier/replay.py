"""Recording a classifier's changes so that they can be applied again to a newer version.

Writers to a model store prepare their change without the store's write lock (loading the model and
embedding the new examples take seconds, and readers and other writers must not wait for that), then
take the lock only to commit. If another writer committed in between, the recorded calls are
replayed on the newest version under the lock; the embeddings they need are in the encoder's
memory cache by then, so the replay is cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def recorded(method: F) -> F:
    """Mark a public method that changes the classifier: a successful call is appended to the
    instance's replay log (``_replay``) while one is open (:func:`start`)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        log = self.__dict__.get("_replay")
        if log is not None:
            log.append((method.__name__, args, kwargs))
        return result

    return wrapper  # type: ignore[return-value]


def start(clf: Any) -> list:
    """Open a replay log on `clf` and return it."""
    clf.__dict__["_replay"] = log = []
    return log


def stop(clf: Any) -> list:
    """Close `clf`'s replay log and return what it recorded."""
    return clf.__dict__.pop("_replay", None) or []


def replay(clf: Any, log: list) -> None:
    """Apply the recorded calls of `log` to `clf`, in order."""
    for name, args, kwargs in log:
        getattr(clf, name)(*args, **kwargs)
