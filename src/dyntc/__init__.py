"""dyntc: dynamic text classification with metric learning (Wohlwend et al., 2019, and beyond)."""

import os as _os
import sys as _sys

# Before torch loads its OpenMP runtime (which reads this once): idle OpenMP threads sleep instead of
# spinning, as under the `dyntc` command. Spinning threads take the cores from everything else, and
# on a busy host a one-text predict then waits for them (bench/omp_wait.py, docs/classifier.md).
# A value the user set wins; once torch is imported it is too late, and nothing is changed.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from dyntc._version import __version__  # noqa: E402
from dyntc.errors import DyntcError, DyntcWarning, NotFittedError  # noqa: E402

__all__ = ["__version__", "DynamicClassifier", "DyntcError", "DyntcWarning", "NotFittedError"]


def __getattr__(name: str):
    # Lazy: `import dyntc` stays light; torch loads only when the classifier is first used.
    if name == "DynamicClassifier":
        from dyntc.classifier import DynamicClassifier

        return DynamicClassifier
    raise AttributeError(f"module 'dyntc' has no attribute {name!r}")
