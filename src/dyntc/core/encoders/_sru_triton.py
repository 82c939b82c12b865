"""Triton kernels for the SRU elementwise recurrence (CUDA): the GPU backend of the fast path.

Same semantics and array layout as the numba backend (``_sru_kernels``): ``U`` (T, B, D, K, H)
C-contiguous, each gate's row over the hidden units contiguous; ``x`` (T, B, D, H) the highway
input when K == 3 (times ``scale``), ``U[:, :, :, 3]`` when K == 4; ``weight_c`` / ``bias``
(2, D, H); ``c0`` and the dropout mask (B, D, H); ``pad`` (T, B). Direction d == 1 runs backwards
in time.

One program per (row (b, d), block of hidden units) walks the row's time steps in order, as
``sru``'s CUDA kernel does: rows and hidden units are independent, time is sequential. Loads of
``U[t]`` are contiguous over the hidden block. Arithmetic is float32 (float64 for float64 inputs);
float16 / bfloat16 inputs (autocast) are read and written in their own dtype, the state is kept in
float32.

Unlike the CPU kernels, the training forward saves only the states: ``c_hist[s]`` is the state
after ``s`` steps of the direction's own time order (``c_hist[0] = c0``), so the backward reads
c_{t-1} and c_t without branching on the first step, and recomputes the gates (cheap on a GPU,
and it halves the saved memory). The parameter gradients are summed per row in registers and
reduced over the batch by torch.

Tested without a GPU: ``TRITON_INTERPRET=1`` runs these kernels on CPU tensors (numerical
equivalence with the reference path, tests/encoders/test_sru_triton.py), and ``triton.compile`` builds them
for sm_80 / sm_90 from the CPU.
"""

from __future__ import annotations

import contextlib
import os

# Triton 3.9 warns that its default (FMA contraction on) will change; keep it, and say so explicitly
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["recurrence_forward", "recurrence_backward", "empty"]


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _program_position(D, H, BLOCK_H: tl.constexpr):
    """This program's row n = (b, d) and its block j of hidden units (`inside`: j < H)."""
    n = tl.program_id(0)
    b = n // D
    d = n - b * D
    j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    return n, b, d, j, j < H


@triton.jit
def _step_gates(U, X, row, j, inside, H, c_prev, vf, vr, bf, br, scale, K4: tl.constexpr):
    """One time step's u0 (U's first column), forget and reset gates and highway input for
    row = (t, b, d) (int64), from c_{t-1}, in c_prev's dtype (the compute dtype)::

        f = sigmoid(U1 + v_f c_{t-1} + b_f),  r = sigmoid(U2 + v_r c_{t-1} + b_r),
        x' = U3 (K == 4) or x * scale (K == 3)
    """
    u = U + row * (3 + K4) * H + j
    u0 = tl.load(u, mask=inside, other=0.0).to(c_prev.dtype)
    fg = _sigmoid(tl.load(u + H, mask=inside, other=0.0).to(c_prev.dtype) + vf * c_prev + bf)
    rg = _sigmoid(tl.load(u + 2 * H, mask=inside, other=0.0).to(c_prev.dtype) + vr * c_prev + br)
    if K4:
        xv = tl.load(u + 3 * H, mask=inside, other=0.0).to(c_prev.dtype)
    else:
        xv = tl.load(X + row * H + j, mask=inside, other=0.0).to(c_prev.dtype) * scale
    return u0, fg, rg, xv


@triton.jit
def _row_parameters(WC, BIAS, MC, n, d, D, H, j, inside, HAS_MASK: tl.constexpr, BLOCK_H: tl.constexpr):
    """v_f, v_r, b_f, b_r and the dropout mask (ones without one) of row n = (b, d), hidden units j."""
    vf = tl.load(WC + d * H + j, mask=inside, other=0.0)
    vr = tl.load(WC + (D + d) * H + j, mask=inside, other=0.0)
    bf = tl.load(BIAS + d * H + j, mask=inside, other=0.0)
    br = tl.load(BIAS + (D + d) * H + j, mask=inside, other=0.0)
    if HAS_MASK:
        m = tl.load(MC + n * H + j, mask=inside, other=0.0)
    else:
        m = tl.full([BLOCK_H], 1.0, WC.dtype.element_ty)
    return vf, vr, bf, br, m


@triton.jit(do_not_specialize=["L", "B"])  # batch shapes vary: one compiled kernel for all
def _forward_kernel(
    U, X, WC, BIAS, C0, MC, PAD, H_OUT, C_LAST, C_HIST,
    SCALE, L, B, D, H,
    K4: tl.constexpr, HAS_MASK: tl.constexpr, HAS_PAD: tl.constexpr, TRAIN: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    n, b, d, j, inside = _program_position(D, H, BLOCK_H)
    c = tl.load(C0 + n * H + j, mask=inside, other=0.0)  # the compute dtype (float32 / float64)
    vf, vr, bf, br, m = _row_parameters(WC, BIAS, MC, n, d, D, H, j, inside, HAS_MASK, BLOCK_H)
    scale = tl.load(SCALE)
    for s in range(L):
        t = s + d * (L - 1 - 2 * s)  # d == 1: t = L - 1 - s
        row = (t * B + b).to(tl.int64) * D + d  # (t, b, d)
        u0, fg, rg, xv = _step_gates(U, X, row, j, inside, H, c, vf, vr, bf, br, scale, K4)
        cn = (c - u0) * fg + u0
        hv = (cn - xv) * m * rg + xv
        if HAS_PAD:
            padded = tl.load(PAD + t * B + b) != 0
            cn = tl.where(padded, c, cn)
            hv = tl.where(padded, 0.0, hv)
        tl.store(H_OUT + row * H + j, hv.to(H_OUT.dtype.element_ty), mask=inside)
        if TRAIN:
            tl.store(C_HIST + ((s + 1) * B * D + n).to(tl.int64) * H + j, cn, mask=inside)
        c = cn
    tl.store(C_LAST + n * H + j, c, mask=inside)


@triton.jit(do_not_specialize=["L", "B"])
def _backward_kernel(
    U, X, WC, BIAS, MC, PAD, C_HIST, GH, GC_LAST, GU, GX, GC0, GPARAM,
    SCALE, L, B, D, H,
    K4: tl.constexpr, HAS_MASK: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """GPARAM (B, 4, D, H) in the compute dtype: per-row sums of the gradients of v_f, v_r, b_f, b_r."""
    n, b, d, j, inside = _program_position(D, H, BLOCK_H)
    gc = tl.load(GC_LAST + n * H + j, mask=inside, other=0.0)  # dL/dc_t, carried backwards
    vf, vr, bf, br, m = _row_parameters(WC, BIAS, MC, n, d, D, H, j, inside, HAS_MASK, BLOCK_H)
    scale = tl.load(SCALE)
    g_vf = tl.full([BLOCK_H], 0.0, gc.dtype)
    g_vr = tl.full([BLOCK_H], 0.0, gc.dtype)
    g_bf = tl.full([BLOCK_H], 0.0, gc.dtype)
    g_br = tl.full([BLOCK_H], 0.0, gc.dtype)
    for s_back in range(L):
        s = L - 1 - s_back  # step index in the direction's forward order
        t = s + d * (L - 1 - 2 * s)
        row = (t * B + b).to(tl.int64) * D + d
        cp = tl.load(C_HIST + (s * B * D + n).to(tl.int64) * H + j, mask=inside, other=0.0)  # c_{t-1}
        ct = tl.load(C_HIST + ((s + 1) * B * D + n).to(tl.int64) * H + j, mask=inside, other=0.0)
        u0, fg, rg, xv = _step_gates(U, X, row, j, inside, H, cp, vf, vr, bf, br, scale, K4)  # recomputed
        gh = tl.load(GH + row * H + j, mask=inside, other=0.0).to(gc.dtype)
        gct = gc + gh * m * rg  # dL/dc_t
        grp = gh * (ct - xv) * m * (rg * (1.0 - rg))  # dL/d(reset pre-activation)
        gxv = gh * (1.0 - m * rg)  # dL/d(highway input)
        gfp = gct * (cp - u0) * (fg * (1.0 - fg))  # dL/d(forget pre-activation)
        g0 = gct * (1.0 - fg)
        gcn = gct * fg + gfp * vf + grp * vr  # dL/dc_{t-1}
        if HAS_PAD:
            live = tl.load(PAD + t * B + b) == 0
            grp = tl.where(live, grp, 0.0)
            gxv = tl.where(live, gxv, 0.0)
            gfp = tl.where(live, gfp, 0.0)
            g0 = tl.where(live, g0, 0.0)
            gcn = tl.where(live, gcn, gc)  # padding carries c unchanged
        gu = GU + row * (3 + K4) * H + j
        tl.store(gu, g0.to(GU.dtype.element_ty), mask=inside)
        tl.store(gu + H, gfp.to(GU.dtype.element_ty), mask=inside)
        tl.store(gu + 2 * H, grp.to(GU.dtype.element_ty), mask=inside)
        if K4:
            tl.store(gu + 3 * H, gxv.to(GU.dtype.element_ty), mask=inside)
        else:
            tl.store(GX + row * H + j, (gxv * scale).to(GX.dtype.element_ty), mask=inside)
        g_vf += gfp * cp
        g_vr += grp * cp
        g_bf += gfp
        g_br += grp
        gc = gcn
    tl.store(GC0 + n * H + j, gc, mask=inside)
    gp = GPARAM + (b * 4 * D + d) * H + j  # (b, i, d, j) = gp + i * D * H
    tl.store(gp, g_vf, mask=inside)
    tl.store(gp + D * H, g_vr, mask=inside)
    tl.store(gp + 2 * D * H, g_bf, mask=inside)
    tl.store(gp + 3 * D * H, g_br, mask=inside)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _launch(kernel, rows: int, H: int, device: torch.device, *args, **constexprs) -> None:
    """Run `kernel` with one single-warp program per row and 32 hidden units (as many warps as
    sru's CUDA kernel has threads / 32: B * D * H / 32), on the tensors' device (Triton launches on
    the current CUDA device)."""
    block = min(32, triton.next_power_of_2(max(H, 1)))
    grid = (rows, triton.cdiv(H, block))
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](*args, BLOCK_H=block, num_warps=1, **constexprs)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Work buffers: the CUDA caching allocator already reuses memory, no pool needed."""
    return torch.empty(shape, dtype=dtype, device=device)


def recurrence_forward(U, x, scale, weight_c, bias, c0, mask_c, mask_pad, train: bool):
    """As ``_sru_kernels.recurrence_forward``: U (T, B, D, K, H) -> h (T, B, D, H), c_last (B, D, H),
    and what the backward needs when `train` (else None). `scale`: a float or a one-element tensor.
    h and c come in the dtype PyTorch's reference path gives them: U's promoted with weight_c's
    (float16 for a float16 model; float32 for float16 U from autocast with float32 weights)."""
    L, B, D, K, H = U.shape
    dev = U.device
    cd = _compute_dtype(U.dtype)
    out_dtype = torch.promote_types(U.dtype, weight_c.dtype)
    k4 = K == 4
    U = U.detach().contiguous()
    x = U if k4 else x.detach().reshape(L, B, D, H).contiguous()  # (unused when k4)
    wc = weight_c.detach().to(cd).reshape(2, D, H).contiguous()
    bs = bias.detach().to(cd).reshape(2, D, H).contiguous()
    c0 = c0.detach().to(cd).reshape(B, D, H).contiguous()
    mc = None if mask_c is None else mask_c.detach().to(cd).reshape(B, D, H).contiguous()
    pad = None if mask_pad is None else mask_pad.to(device=dev, dtype=torch.uint8).contiguous()
    sc = torch.ones(1, dtype=cd, device=dev) if k4 else torch.as_tensor(scale).detach().to(dev, cd).reshape(1)
    h = torch.empty((L, B, D, H), dtype=out_dtype, device=dev)
    c_last = torch.empty((B, D, H), dtype=cd, device=dev)
    c_hist = torch.empty((L + 1, B, D, H), dtype=cd, device=dev) if train else c_last
    if train:
        c_hist[0] = c0
    if L == 0 or B == 0 or H == 0:
        c_last.copy_(c0)
    else:
        # an absent mask / padding is passed as an unread stand-in pointer (c0)
        _launch(_forward_kernel, B * D, H, dev, U, x, wc, bs, c0, c0 if mc is None else mc, c0 if pad is None else pad,
                h, c_last, c_hist, sc, L, B, D, H, K4=k4, HAS_MASK=mc is not None, HAS_PAD=pad is not None,
                TRAIN=train)  # fmt: skip
    c_last = c_last.to(out_dtype)
    if not train:
        return h, c_last, None
    return h, c_last, (U, x, wc, bs, mc, pad, c_hist, sc)


def recurrence_backward(saved, gh, gc_last):
    """-> gU (T, B, D, K, H), gx (T, B, D, H) or None when K == 4, g_weight_c (2DH), g_bias (2DH),
    g_c0 (B, D, H)."""
    U, x, wc, bs, mc, pad, c_hist, sc = saved
    L, B, D, K, H = U.shape
    dev = U.device
    cd = c_hist.dtype
    k4 = K == 4
    gh = torch.zeros((L, B, D, H), dtype=U.dtype, device=dev) if gh is None else gh.reshape(L, B, D, H).contiguous()
    gc_last = torch.zeros((B, D, H), dtype=cd, device=dev) if gc_last is None else gc_last.to(cd).reshape(B, D, H).contiguous()
    gU = torch.empty_like(U)
    gx = gU if k4 else torch.empty((L, B, D, H), dtype=x.dtype, device=dev)
    gc0 = torch.empty((B, D, H), dtype=cd, device=dev)
    gparam = torch.zeros((B, 4, D, H), dtype=cd, device=dev)
    if L == 0 or B == 0 or H == 0:
        gc0.copy_(gc_last)
    else:
        # (an absent mask / padding: an unread stand-in pointer, c_hist)
        _launch(_backward_kernel, B * D, H, dev, U, x, wc, bs, c_hist if mc is None else mc,
                c_hist if pad is None else pad, c_hist, gh, gc_last, gU, gx, gc0, gparam, sc, L, B, D, H,
                K4=k4, HAS_MASK=mc is not None, HAS_PAD=pad is not None)  # fmt: skip
    gp = gparam.sum(dim=0)  # (4, D, H)
    return gU, (None if k4 else gx), gp[:2].reshape(-1), gp[2:].reshape(-1), gc0
