"""What dyntc's numba kernels (SRU recurrence, Fréchet-mean solver) share.

* :func:`run_blocks`: run a GIL-releasing kernel ``kernel(row0, row1, *args)`` over independent
  rows on ``torch.get_num_threads()`` threads, so the kernels follow the thread count the user gave
  PyTorch.
* :func:`wide_vectors`: ask LLVM for 512-bit vectors in the calling jitted function.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from numba import types
from numba.extending import intrinsic

_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] = (0, 0)  # (pid, workers): a forked child must not reuse the parent's pool
_pool_lock = threading.Lock()


def run_blocks(kernel, rows: int, *args, min_rows_per_thread: int = 8) -> None:
    """Run ``kernel(r0, r1, *args)`` over rows [0, rows) split into contiguous blocks, one per
    thread (at most ``torch.get_num_threads()``, and blocks of at least ``min_rows_per_thread``:
    below that, thread hand-off costs more than it saves). The calling thread takes the first block."""
    global _pool, _pool_key
    nthreads = max(1, min(torch.get_num_threads(), rows // max(1, min_rows_per_thread)))
    if nthreads == 1:
        kernel(0, rows, *args)
        return
    key = (os.getpid(), nthreads - 1)
    with _pool_lock:
        if _pool is None or _pool_key != key:
            if _pool is not None and _pool_key[0] == key[0]:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=nthreads - 1, thread_name_prefix="dyntc-kernel")
            _pool_key = key
        pool = _pool
    bounds = [rows * i // nthreads for i in range(nthreads + 1)]
    futures = [pool.submit(kernel, bounds[i], bounds[i + 1], *args) for i in range(1, nthreads)]
    try:
        kernel(bounds[0], bounds[1], *args)
    finally:
        for fut in futures:
            fut.result()


@intrinsic
def wide_vectors(typingctx):
    """Mark the calling jitted function with LLVM's ``"prefer-vector-width"="512"``.

    LLVM tunes Skylake-X and later Intel cores to vectorise with 256-bit registers even where
    AVX-512 is available (the clang default ``-mprefer-vector-width=256``); for these kernels
    512-bit vectors measured 2.1x faster (forward) on the CI machine's Xeon. On CPUs without
    AVX-512 the attribute has no effect. Call it first thing in each function with a hot loop
    (the attribute is per LLVM function; functions inlined by numba take their caller's)."""

    def codegen(context, builder, signature, args):
        # llvmlite's FunctionAttributes (a set) validates enum attributes only; this is a string
        # attribute, added past the validation. Only a performance hint: skipped if llvmlite changes.
        try:
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        except Exception:  # pragma: no cover - depends on the llvmlite version
            pass
        return context.get_dummy_value()

    return types.none(), codegen
