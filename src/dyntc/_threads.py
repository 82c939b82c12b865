"""Running a GIL-releasing compiled kernel over independent rows on several threads.

Used by the numba kernels (SRU recurrence, Fréchet-mean solver): each takes ``(row0, row1, *args)``
and processes rows ``row0 <= row < row1``; rows are split into ``torch.get_num_threads()``
contiguous blocks so that the kernels follow the thread count the user gave PyTorch.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

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
