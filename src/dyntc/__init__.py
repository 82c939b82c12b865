"""dyntc: dynamic text classification with metric learning (Wohlwend et al., 2019, and beyond)."""

from dyntc._version import __version__
from dyntc.errors import DyntcError, DyntcWarning, NotFittedError

__all__ = ["__version__", "DynamicClassifier", "DyntcError", "DyntcWarning", "NotFittedError"]


def __getattr__(name: str):
    # Lazy: `import dyntc` stays light; torch loads only when the classifier is first used.
    if name == "DynamicClassifier":
        from dyntc.classifier import DynamicClassifier

        return DynamicClassifier
    raise AttributeError(f"module 'dyntc' has no attribute {name!r}")
