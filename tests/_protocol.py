"""Helpers of the protocol tests (tests/protocol/): a `tiny` run of the protocol, a results row without
its timings, and a training function wrapper that counts (or interrupts) its calls."""

from dyntc.protocol.reproduce import reproduce


def run_tiny(data, out, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("log", lambda msg: None)
    return reproduce(data, "tiny", out, **kw)


TIMING_KEYS = {"train_seconds", "cell_seconds", "finished", "seconds", "machine"}  # and provenance


def without_timings(row: dict) -> dict:
    """`row` (a cell, or a model's pretraining record) without what differs between identical runs."""
    return {k: v for k, v in row.items() if k not in TIMING_KEYS}


class Counter:
    """Wraps a training function and counts its calls."""

    def __init__(self, fn, fail_after=None):
        self.fn, self.calls, self.fail_after = fn, 0, fail_after
        self.configs = []  # each call's TrainConfig

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.configs.append(args[3] if len(args) > 3 else kwargs.get("cfg"))
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        return self.fn(*args, **kwargs)
