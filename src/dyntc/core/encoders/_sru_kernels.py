"""numba kernels for the SRU elementwise recurrence: the CPU backend of the fast path.

A backend gives ``sru.SRULayerFunction`` (which runs the layer's GEMMs with torch) three things:
``recurrence_forward``, ``recurrence_backward`` and ``empty`` (work buffers, here from a pool);
``_sru_triton`` is the CUDA one. ``SRUFunction`` is the recurrence alone as an autograd Function
(for tests).

Kernel layout (C-contiguous): ``U`` (T, B, D, K, H); ``x`` (T, B, D, H), the layer input when
K == 3 (highway input ``x * scale``; when K == 4 it is ``U[:, :, :, 3]``); ``weight_c`` / ``bias``
(2, D, H); ``c0`` and the dropout mask ``mc`` (B, D, H); ``pad`` (T, B) bool. Direction d == 1 runs
backwards in time.

Each row (b, d) is an independent recurrence, sequential in t and elementwise over the hidden
units. The kernels loop over time outermost and over a block of rows inside, so that every step
streams through a contiguous slab of ``U[t]`` while the rows' states stay in cache; blocks of rows
run on ``torch.get_num_threads()`` Python threads (``dyntc.core._compiled``; the kernels release the GIL).
The innermost loop over hidden units vectorises (checked with LLVM remarks), with 512-bit vectors
where the CPU has them (see ``wide_vectors``), without fast-math: the float32 sigmoid is
an inlined, branch-free Cephes-style ``expf`` (about 1 ulp) with explicit FMAs; float64 uses
``np.exp``. The training forward saves c_t, f_t, r_t; the backward reuses them (no exp), flushes
gradients below 1e-30 to zero (see FLUSH_BELOW_F32) and accumulates the parameter gradients per
row (kernel dtype over 16 steps, then float64).

numba's on-disk cache (``cache=True``) is keyed on this file alone: after editing
``dyntc.core._compiled``, touch this file so that the kernels are recompiled.
"""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from dyntc.core._compiled import run_blocks, wide_vectors

# Backward-pass results smaller than this in magnitude are set to 0. Gradients flowing back through
# many forget gates decay geometrically and would otherwise underflow into float32 denormals, which
# make both this kernel and the following GEMMs some 100x slower (observed: a 144x200 training step
# going from 2 s to 9 s). 1e-30 leaves headroom so that products with small weights stay normal;
# it is far below the float32 resolution of any gradient that matters.
FLUSH_BELOW_F32 = 1e-30
FLUSH_BELOW_F64 = 1e-300


_F = np.float32
_EXP_HI = _F(88.0)
_EXP_LO = _F(-87.0)
_LOG2E = _F(1.44269504088896341)
_HALF = _F(0.5)
_ONE = _F(1.0)
_C1 = _F(-0.693359375)
_C2 = _F(2.12194440e-4)
_P0 = _F(1.9875691500e-4)
_P1 = _F(1.3981999507e-3)
_P2 = _F(8.3334519073e-3)
_P3 = _F(4.1665795894e-2)
_P4 = _F(1.6666665459e-1)
_P5 = _F(5.0000001201e-1)
_I127 = np.int64(127)
_I23 = np.int64(23)


@intrinsic
def _int_bits_as_float32(typingctx, i):
    """The float32 whose bit pattern is the low 32 bits of integer `i` (no call: vectorisable)."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())

    return types.float32(types.int64), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c with a single rounding (llvm.fma: one instruction on FMA hardware)."""
    if not (a == b == c and a in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)

    return a(a, a, a), codegen


def sigmoid(x):  # pragma: no cover - replaced by the overload inside jitted code
    return 1.0 / (1.0 + np.exp(-x))


@overload(sigmoid)
def _sigmoid_overload(x):
    if x == types.float32:

        def impl(x):
            z = min(max(-x, _EXP_LO), _EXP_HI)  # exp(z), z = -x clamped: e**88 < FLT_MAX
            n = np.floor(_fma(z, _LOG2E, _HALF))  # z = n ln2 + g, |g| <= ln2 / 2
            g = _fma(n, _C1, z)
            g = _fma(n, _C2, g)
            p = _fma(_P0, g, _P1)
            p = _fma(p, g, _P2)
            p = _fma(p, g, _P3)
            p = _fma(p, g, _P4)
            p = _fma(p, g, _P5)
            e = _fma(p, g * g, g) + _ONE  # e**g
            e = e * _int_bits_as_float32((np.int64(n) + _I127) << _I23)  # * 2**n
            s = _ONE / (_ONE + e)
            return x if x != x else s  # keep NaN

        return impl
    if x == types.float64:

        def impl(x):
            return 1.0 / (1.0 + np.exp(-x))

        return impl
    return None


_JIT = dict(cache=True, fastmath=False, error_model="numpy")


# Row functions: one time step of one row (b, d) over the hidden units. The forward ones are
# inlined into the kernels (numba IR inlining: ~25% faster, no per-row array views); the backward
# one is faster as a call (inlined, LLVM vectorises it less well).


@njit(inline="always", **_JIT)
def _fwd_row(u0, u1, u2, xr, scale, vf, vr, bf, br, m, c, hrow):  # pragma: no cover - numba
    wide_vectors()
    for j in range(c.shape[0]):
        cp = c[j]
        fg = sigmoid(u1[j] + vf[j] * cp + bf[j])
        rg = sigmoid(u2[j] + vr[j] * cp + br[j])
        cn = (cp - u0[j]) * fg + u0[j]
        x = xr[j] * scale
        hrow[j] = (cn - x) * m[j] * rg + x
        c[j] = cn


@njit(inline="always", **_JIT)
def _fwd_row_train(u0, u1, u2, xr, scale, vf, vr, bf, br, m, cprev, hrow, crow, frow, rrow):  # pragma: no cover
    wide_vectors()
    for j in range(cprev.shape[0]):
        cp = cprev[j]
        fg = sigmoid(u1[j] + vf[j] * cp + bf[j])
        rg = sigmoid(u2[j] + vr[j] * cp + br[j])
        cn = (cp - u0[j]) * fg + u0[j]
        x = xr[j] * scale
        hrow[j] = (cn - x) * m[j] * rg + x
        crow[j] = cn
        frow[j] = fg
        rrow[j] = rg


@njit(**_JIT)
def _bwd_row(t, b, d, n, cprev, xr, gxr, U, scale, wc, mc, c_all, f_all, r_all, gh, gc, gU, acc, one, tiny):  # pragma: no cover
    """One step t backwards of row (b, d) (the kernel's n-th row): from dL/dh_t and the carried
    dL/dc_t (``gc[n]``) to the gradients of U_t, the highway input (``gxr``) and c_{t-1}; adds the
    parameter gradients' terms to ``acc[n]`` (4, H): v_f, v_r, b_f, b_r. ``cprev`` (c_{t-1}), ``xr``
    (the highway input) and ``gxr`` are row views chosen by the caller; the other arrays are indexed
    whole, because a view per array per call cost ~17% of the kernel (measured, 144 x 32 x 128).
    At ~7 ns per element on one core it streams ~50 bytes per element: memory-bound, not compute."""
    wide_vectors()
    zero = one - one
    for j in range(gc.shape[1]):
        ghj = gh[t, b, d, j]
        rj = r_all[t, b, d, j]
        fj = f_all[t, b, d, j]
        mj = mc[b, d, j]
        cp = cprev[j]
        xv = xr[j] * scale
        gct = gc[n, j] + ghj * mj * rj  # dL/dc_t
        grp = ghj * (c_all[t, b, d, j] - xv) * mj * (rj * (one - rj))  # dL/d(reset pre-activation)
        grp = grp if abs(grp) >= tiny else zero
        gxv = ghj * (one - mj * rj) * scale  # dL/dx (highway)
        gxr[j] = gxv if abs(gxv) >= tiny else zero
        gfp = gct * (cp - U[t, b, d, 0, j]) * (fj * (one - fj))  # dL/d(forget pre-activation)
        gfp = gfp if abs(gfp) >= tiny else zero
        g0 = gct * (one - fj)
        gU[t, b, d, 0, j] = g0 if abs(g0) >= tiny else zero
        gU[t, b, d, 1, j] = gfp
        gU[t, b, d, 2, j] = grp
        acc[n, 0, j] += gfp * cp
        acc[n, 1, j] += grp * cp
        acc[n, 2, j] += gfp
        acc[n, 3, j] += grp
        gcn = gct * fj + gfp * wc[0, d, j] + grp * wc[1, d, j]  # dL/dc_{t-1}
        gc[n, j] = gcn if abs(gcn) >= tiny else zero


# Kernels over rows n0 <= n < n1 (row n = (b, d) = divmod(n, D)), time outermost.


@njit(nogil=True, **_JIT)
def sru_forward_infer(n0, n1, U, x, k4, scale, wc, bias, c0, mc, pad, h, c_last):  # pragma: no cover - numba
    wide_vectors()
    L, B, D, K, H = U.shape
    c = np.empty((n1 - n0, H), U.dtype)
    for n in range(n0, n1):
        c[n - n0] = c0[n // D, n % D]
    for s in range(L):
        for n in range(n0, n1):
            b = n // D
            d = n - b * D
            t = L - 1 - s if d == 1 else s
            if pad[t, b]:
                h[t, b, d, :] = 0
            else:
                xr = U[t, b, d, 3] if k4 else x[t, b, d]
                _fwd_row(U[t, b, d, 0], U[t, b, d, 1], U[t, b, d, 2], xr, scale, wc[0, d], wc[1, d], bias[0, d],
                         bias[1, d], mc[b, d], c[n - n0], h[t, b, d])  # fmt: skip
    for n in range(n0, n1):
        c_last[n // D, n % D, :] = c[n - n0]


@njit(nogil=True, **_JIT)
def sru_forward_train(n0, n1, U, x, k4, scale, wc, bias, c0, mc, pad, h, c_last, c_all, f_all, r_all):  # pragma: no cover
    """Also stores c_t (c carried over padding), f_t, r_t for the backward pass."""
    wide_vectors()
    L, B, D, K, H = U.shape
    for s in range(L):
        for n in range(n0, n1):
            b = n // D
            d = n - b * D
            t = L - 1 - s if d == 1 else s
            tp = t + 1 if d == 1 else t - 1  # the previous step in this direction's order
            cprev = c0[b, d] if s == 0 else c_all[tp, b, d]
            if pad[t, b]:
                h[t, b, d, :] = 0
                c_all[t, b, d, :] = cprev
            else:
                xr = U[t, b, d, 3] if k4 else x[t, b, d]
                _fwd_row_train(U[t, b, d, 0], U[t, b, d, 1], U[t, b, d, 2], xr, scale, wc[0, d], wc[1, d],
                               bias[0, d], bias[1, d], mc[b, d], cprev, h[t, b, d], c_all[t, b, d],
                               f_all[t, b, d], r_all[t, b, d])  # fmt: skip
    for n in range(n0, n1):
        b = n // D
        d = n - b * D
        c_last[b, d, :] = c0[b, d] if L == 0 else c_all[0 if d == 1 else L - 1, b, d]


@njit(nogil=True, **_JIT)
def sru_backward(n0, n1, U, x, k4, scale, wc, c0, mc, pad, c_all, f_all, r_all, gh, gc_last, one, tiny,
                 gU, gx, gc0, gparam):  # pragma: no cover  # fmt: skip
    """gparam (B, 4, D, H) float64: per-row sums of the gradients for v_f, v_r, b_f, b_r."""
    wide_vectors()
    L, B, D, K, H = U.shape
    gc = np.empty((n1 - n0, H), U.dtype)
    acc = np.zeros((n1 - n0, 4, H), np.float64)
    acc_short = np.zeros((n1 - n0, 4, H), U.dtype)  # over the last <= 16 steps: vectorises wider
    for n in range(n0, n1):
        gc[n - n0] = gc_last[n // D, n % D]
    for s in range(L):
        for n in range(n0, n1):
            b = n // D
            d = n - b * D
            t = s if d == 1 else L - 1 - s  # reverse of the forward order
            tp = t + 1 if d == 1 else t - 1  # the step before t in the forward order
            gxr = gU[t, b, d, 3] if k4 else gx[t, b, d]
            if pad[t, b]:
                gU[t, b, d, :, :] = 0
                gxr[:] = 0
            else:
                cprev = c0[b, d] if s == L - 1 else c_all[tp, b, d]
                xr = U[t, b, d, 3] if k4 else x[t, b, d]
                _bwd_row(t, b, d, n - n0, cprev, xr, gxr, U, scale, wc, mc, c_all, f_all, r_all, gh, gc, gU, acc_short,
                         one, tiny)  # fmt: skip
        if s % 16 == 15 or s == L - 1:
            acc += acc_short
            acc_short[:] = 0
    for n in range(n0, n1):
        b = n // D
        d = n - b * D
        gc0[b, d, :] = gc[n - n0]
        for i in range(4):
            gparam[b, i, d, :] = acc[n - n0, i]


# Unidirectional forward kernels (D == 1, the paper's setting; arrays with the D axis dropped:
# U (T, B, K, H), x / h / c / f / r (T, B, H), c0 / mc (B, H), weight_c / bias (2, H)). Each time
# step handles the thread's block of batch rows [b0, b1) in one call over contiguous (rows, H)
# slabs instead of one call per row (~15% faster; the bidirectional kernels above are row-wise
# because the two directions visit different time steps). The same blocking made the backward
# slower (measured: 16 vs 12 ns per element), so the backward stays row-wise for both.


@njit(**_JIT)
def _fwd_block(Ut, xt, k4, scale, vf, vr, bf, br, m, padt, cprev, ht, ct, ft, rt, store):  # pragma: no cover
    """One time step for R rows: Ut (R, K, H), xt / m / cprev / ht / ct / ft / rt (R, H), padt (R,).
    Writes c_t to ct (which may be cprev itself when not `store`), and f_t, r_t when `store`."""
    wide_vectors()
    R = Ut.shape[0]
    H = Ut.shape[2]
    for i in range(R):
        if padt[i]:
            for j in range(H):
                ht[i, j] = 0
                ct[i, j] = cprev[i, j]
            continue
        for j in range(H):
            cp = cprev[i, j]
            u0 = Ut[i, 0, j]
            fg = sigmoid(Ut[i, 1, j] + vf[j] * cp + bf[j])
            rg = sigmoid(Ut[i, 2, j] + vr[j] * cp + br[j])
            cn = (cp - u0) * fg + u0
            xv = (Ut[i, 3, j] if k4 else xt[i, j]) * scale
            ht[i, j] = (cn - xv) * m[i, j] * rg + xv
            ct[i, j] = cn
            if store:
                ft[i, j] = fg
                rt[i, j] = rg


@njit(nogil=True, **_JIT)
def sru_forward_infer_uni(b0, b1, U, x, k4, scale, wc, bias, c0, mc, pad, h, c_last):  # pragma: no cover
    wide_vectors()
    L = U.shape[0]
    c_in = c0[b0:b1].copy()
    c_out = np.empty_like(c_in)  # ping-pong: a kernel never reads and writes the same buffer
    unused = np.empty((1, 1), U.dtype)
    for t in range(L):
        xt = x[0, 0:1] if k4 else x[t, b0:b1]  # (unused when k4)
        _fwd_block(U[t, b0:b1], xt, k4, scale, wc[0], wc[1], bias[0], bias[1], mc[b0:b1], pad[t, b0:b1], c_in,
                   h[t, b0:b1], c_out, unused, unused, False)  # fmt: skip
        c_in, c_out = c_out, c_in
    c_last[b0:b1] = c_in


@njit(nogil=True, **_JIT)
def sru_forward_train_uni(b0, b1, U, x, k4, scale, wc, bias, c0, mc, pad, h, c_last, c_all, f_all, r_all):  # pragma: no cover
    wide_vectors()
    L = U.shape[0]
    for t in range(L):
        cprev = c0[b0:b1] if t == 0 else c_all[t - 1, b0:b1]
        xt = x[0, 0:1] if k4 else x[t, b0:b1]  # (unused when k4)
        _fwd_block(U[t, b0:b1], xt, k4, scale, wc[0], wc[1], bias[0], bias[1], mc[b0:b1], pad[t, b0:b1], cprev,
                   h[t, b0:b1], c_all[t, b0:b1], f_all[t, b0:b1], r_all[t, b0:b1], True)  # fmt: skip
    c_last[b0:b1] = c0[b0:b1] if L == 0 else c_all[L - 1, b0:b1]


class _BufferPool:
    """Reuses the large work buffers (U, h, c/f/r, gradients) between calls.

    A fresh multi-megabyte allocation is page-faulted in on first touch (the kernel zeroes every
    page): measured here at ~0.5 ms per MB, i.e. a large share of a training step. Buffers are numpy
    byte arrays handed out as torch tensors (``torch.from_numpy``); a buffer is free again exactly
    when no tensor (or view) refers to it any more, which its reference count tells. Requests are
    served best-fit from free buffers at least as large, so batches of varying length reuse the
    buffers of the longest; free buffers beyond `max_bytes` in total are dropped (largest first).
    """

    min_bytes = 1 << 20  # smaller requests: plain torch.empty (malloc reuses those cheaply)

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bufs: list[np.ndarray] = [np.empty(1, np.uint8)]  # probe, referenced by the list only
        self._base_refs = self._refcounts()[0]  # a buffer's count when nothing else refers to it
        self._bufs = []

    def _refcounts(self) -> list[int]:
        return [sys.getrefcount(b) for b in self._bufs]

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        np_dtype = np.float32 if dtype == torch.float32 else np.float64
        with self._lock:
            best = -1
            for i, refs in enumerate(self._refcounts()):
                size = self._bufs[i].nbytes
                if refs == self._base_refs and size >= nbytes and (best < 0 or size < self._bufs[best].nbytes):
                    best = i
            if best < 0:
                self._bufs.append(np.empty(nbytes, np.uint8))
                best = len(self._bufs) - 1
                self._trim(keep=best)
                best = len(self._bufs) - 1
            return torch.from_numpy(self._bufs[best][:nbytes].view(np_dtype)).view(shape)

    def _trim(self, keep: int) -> None:
        """Drop free buffers, largest first, while the total exceeds max_bytes (never `keep`)."""
        total = sum(b.nbytes for b in self._bufs)
        if total <= self.max_bytes:
            return
        refs = self._refcounts()
        order = sorted(range(len(self._bufs)), key=lambda i: -self._bufs[i].nbytes)
        drop = set()
        for i in order:
            if total <= self.max_bytes:
                break
            if i != keep and refs[i] == self._base_refs:
                drop.add(i)
                total -= self._bufs[i].nbytes
        kept = self._bufs[keep]
        self._bufs = [b for i, b in enumerate(self._bufs) if i not in drop and i != keep] + [kept]

    def clear(self) -> None:
        """Release the free buffers."""
        with self._lock:
            refs = self._refcounts()
            self._bufs = [b for b, r in zip(self._bufs, refs) if r != self._base_refs]


#: Work-buffer pool of the fast path; ``$DYNTC_SRU_POOL_MB`` bounds the memory it keeps (default 2048).
pool = _BufferPool(int(os.environ.get("DYNTC_SRU_POOL_MB", "2048")) << 20)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A work buffer from the pool (`device` is always the CPU here)."""
    return pool.empty(shape, dtype)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _squeeze_d(t: torch.Tensor) -> np.ndarray:
    """The numpy view of `t` without its direction axis (D == 1): (..., 1, K, H) -> (..., K, H),
    (..., 1, H) -> (..., H); the (1, 1, 1, 1) placeholders become (1, 1, 1)."""
    a = t.detach().numpy()
    axis = a.ndim - 3 if a.ndim == 5 else a.ndim - 2
    if a.ndim == 4 and a.shape == (1, 1, 1, 1):
        axis = 0
    return a.reshape(a.shape[:axis] + a.shape[axis + 1 :])


def _scalars(dtype: torch.dtype, scale: float):
    """(scale, 1, flush threshold) as numpy scalars of the kernel's dtype."""
    if dtype == torch.float32:
        return np.float32(scale), np.float32(1.0), np.float32(FLUSH_BELOW_F32)
    return np.float64(scale), np.float64(1.0), np.float64(FLUSH_BELOW_F64)


def recurrence_forward(U, x, scale, weight_c, bias, c0, mask_c, mask_pad, train: bool):
    """The elementwise recurrence over U (T, B, D, K, H); `x` (T, B, D, H) is the highway input
    (times `scale`) when K == 3, ignored when K == 4. Returns h (T, B, D, H), c_last (B, D, H) and,
    when `train`, the tuple of tensors `recurrence_backward` needs (else None)."""
    L, B, D, K, H = U.shape
    dtype = U.dtype
    k4 = K == 4
    scale = 1.0 if k4 else float(scale)  # (a float or a one-element tensor)
    U = U.detach().contiguous()
    x = torch.empty((1, 1, 1, 1), dtype=dtype) if k4 else x.detach().to(dtype).reshape(L, B, D, H).contiguous()
    wc = weight_c.detach().to(dtype).reshape(2, D, H).contiguous()
    bs = bias.detach().to(dtype).reshape(2, D, H).contiguous()
    c0 = c0.detach().to(dtype).reshape(B, D, H).contiguous()
    mc = torch.ones((B, D, H), dtype=dtype) if mask_c is None else mask_c.to(dtype).reshape(B, D, H).contiguous()
    pad = torch.zeros((L, B), dtype=torch.bool) if mask_pad is None else mask_pad.to(torch.bool).contiguous()
    h = pool.empty((L, B, D, H), dtype)
    c_last = torch.empty((B, D, H), dtype=dtype)
    sc = _scalars(dtype, scale)[0]
    uni = D == 1
    sq = _squeeze_d if uni else _np
    args = (sq(U), sq(x), k4, sc, sq(wc), sq(bs), sq(c0), sq(mc), _np(pad), sq(h), sq(c_last))
    if not train:
        run_blocks(sru_forward_infer_uni if uni else sru_forward_infer, B * D, *args)
        return h, c_last, None
    c_all = pool.empty((L, B, D, H), dtype)
    f_all = pool.empty((L, B, D, H), dtype)
    r_all = pool.empty((L, B, D, H), dtype)
    run_blocks(sru_forward_train_uni if uni else sru_forward_train, B * D, *args, sq(c_all), sq(f_all), sq(r_all))
    return h, c_last, (U, x, wc, c0, mc, pad, c_all, f_all, r_all, torch.tensor(scale, dtype=torch.float64))


def recurrence_backward(saved, gh, gc_last):
    """-> gU (T, B, D, K, H), gx (T, B, D, H) or None when K == 4, g_weight_c (2DH), g_bias (2DH),
    g_c0 (B, D, H)."""
    U, x, wc, c0, mc, pad, c_all, f_all, r_all, scale = saved
    L, B, D, K, H = U.shape
    dtype = U.dtype
    k4 = K == 4
    gh = torch.zeros((L, B, D, H), dtype=dtype) if gh is None else gh.to(dtype).reshape(L, B, D, H).contiguous()
    gc_last = torch.zeros((B, D, H), dtype=dtype) if gc_last is None else gc_last.to(dtype).reshape(B, D, H).contiguous()
    gU = pool.empty(tuple(U.shape), dtype)
    gx = torch.empty((1, 1, 1, 1), dtype=dtype) if k4 else pool.empty((L, B, D, H), dtype)
    gc0 = torch.empty((B, D, H), dtype=dtype)
    gparam = np.empty((B, 4, D, H), np.float64)
    sc, one, tiny = _scalars(dtype, float(scale))
    run_blocks(
        sru_backward, B * D, _np(U), _np(x), k4, sc, _np(wc), _np(c0), _np(mc), _np(pad), _np(c_all),
        _np(f_all), _np(r_all), _np(gh), _np(gc_last), one, tiny, gU.numpy(), gx.numpy(), gc0.numpy(), gparam,
    )  # fmt: skip
    gp = torch.from_numpy(gparam.sum(axis=0)).to(dtype)  # (4, D, H)
    return gU, (None if k4 else gx), gp[:2].reshape(-1), gp[2:].reshape(-1), gc0


class SRUFunction(torch.autograd.Function):
    """The recurrence alone: ``(U (T,B,D,K,H), x (T,B,D,H) or None when K == 4, weight_c (2DH),
    bias (2DH), c0 (B,D,H), mask_c (B, DH) or None, mask_pad (T,B) bool or None, scale: float)
    -> (h (T,B,D,H), c (B,D,H))``; the highway input is ``x * scale`` (K == 3) or ``U[:, :, :, 3]``
    (K == 4). CPU only, float32 or float64."""

    @staticmethod
    def forward(ctx, U, x, weight_c, bias, c0, mask_c, mask_pad, scale=1.0):
        h, c_last, saved = recurrence_forward(U, x, scale, weight_c, bias, c0, mask_c, mask_pad, any(ctx.needs_input_grad))
        if saved is not None:
            ctx.save_for_backward(*saved)
        return h, c_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gh, gc_last):
        gU, gx, gwc, gbias, gc0 = recurrence_backward(ctx.saved_tensors, gh, gc_last)
        return gU, gx, gwc, gbias, gc0, None, None, None
