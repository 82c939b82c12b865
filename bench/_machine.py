"""What every benchmark prints about the machine: CPU model, load average, OpenMP wait policy."""

from __future__ import annotations

import os

from dyntc.core.machine import cpu_model

__all__ = ["cpu_model", "load_average", "omp_wait_policy"]


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def omp_wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "unset")
