"""One exception type for every mistake a user can fix.

The CLI prints a :class:`DyntcError` as a one-line message (no traceback) and exits with status 2;
anything else is a bug and keeps its traceback. :class:`DyntcWarning` is the category of every
warning dyntc issues, so that users can filter them.
"""


class DyntcError(ValueError):
    """Bad input, missing data or an incompatible file; the message names the culprit and the fix."""


class UnknownLabelError(DyntcError):
    """A label operation named a label that does not exist."""


class LabelExistsError(DyntcError):
    """A label operation would create a label whose name is taken."""


class NotFittedError(DyntcError, AttributeError):
    """A model was used before `fit` (or `load`)."""


class VersionNotFoundError(DyntcError):
    """A stored version was asked for that the store does not hold (never committed, or pruned)."""


class CalibrationRequiredError(DyntcError):
    """An operation needs a calibrated classifier (``reject``, probabilities fitted on its scores)."""


class DyntcWarning(UserWarning):
    """Something accepted that is probably not what the user meant (duplicate or conflicting
    examples, examples dropped by a split, a calibration that cannot be trusted); the message says
    how to avoid it. Silence them with ``warnings.filterwarnings("ignore", category=DyntcWarning)``."""


def is_int(value) -> bool:
    """An integer, not a bool (``True`` is an int to Python, never a size or a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)

