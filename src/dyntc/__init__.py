"""dyntc: dynamic text classification with metric learning (Wohlwend et al., 2019, and beyond)."""

__version__ = "0.1.0"

from dyntc.errors import DyntcError, NotFittedError  # noqa: E402

__all__ = ["__version__", "DyntcError", "NotFittedError"]
