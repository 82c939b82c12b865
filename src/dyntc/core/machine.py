"""The machine a run or a benchmark ran on, and checks of where it writes and computes: torch devices,
the CPU's model (printed beside every timing, since figures from different CPUs do not compare),
output directories; and a block run with torch's random generators seeded, then put back."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from dyntc.errors import DyntcError


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's random generators seeded with `seed` inside the block and put back as they were after it:
    a fit or a tune is reproducible without resetting the caller's own random stream. The CPU's
    generator is put back always, the CUDA devices' only if CUDA was initialised when the block began
    (forking them otherwise would initialise CUDA on a machine that may never use it); naming the
    devices keeps ``fork_rng`` from warning on a machine with several."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def check_device(device: str, arg: str = "--device") -> torch.device:
    """`device` as a torch.device, or a DyntcError naming `arg` (not a device name, or CUDA absent)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DyntcError(f"{arg} must be a torch device such as 'cpu' or 'cuda', got {device!r}") from exc
    if dev.type not in ("cpu", "cuda"):
        raise DyntcError(f"{arg} must be 'cpu' or 'cuda' (optionally 'cuda:N'), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DyntcError(f"{arg} {device!r} requested but no CUDA device is available: use cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DyntcError(f"{arg} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_description() -> str:
    """CPU model, core and torch thread counts, GPU: recorded beside every run's results."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu_model()} ({os.cpu_count()} cores, torch {torch.get_num_threads()} threads){gpu}"


def check_out_dir(path: Path, arg: str = "--out") -> Path:
    """`path` as an output directory: an error naming `arg` if it exists as something else."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DyntcError(f"{arg} {path} exists and is not a directory: choose another path")
    return path
