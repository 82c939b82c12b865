"""Simple Recurrent Unit (Lei et al., 2018) with the exact semantics of ``sru`` 2.6.0.

``SRU`` mirrors ``sru.SRU`` 2.6.0 (same parameter names, shapes, initialisation and random-number
use), restricted to the options dyntc needs: no projection, no custom module, no deprecated
``rnn_dropout`` / ``use_tanh`` / ``v1``, skip term always on, pre-layer-norm.

Per layer and direction (``k`` = 4 when the layer's input size differs from its output size,
else 3; ``U = x W`` viewed as ``(T, B, dirs, hidden, k)``)::

    f_t = sigmoid(U1_t + v_f * c_{t-1} + b_f)            # forget gate
    r_t = sigmoid(U2_t + v_r * c_{t-1} + b_r)            # reset (highway) gate
    c_t = U0_t + (c_{t-1} - U0_t) * f_t
    x'_t = U3_t                       if k == 4           # projected highway input (scale in W)
           x_t * scale_x              if k == 3 (rescale)  # identity highway input
    h_t = x'_t + (c_t - x'_t) * m * r_t                  # m: dropout mask (B, out), training only

The backward direction (bidirectional) runs the same recurrence from t = T-1 down to 0. Where
``mask_pad[t, b]`` is true, ``c`` is carried unchanged and ``h_t = 0``. ``v_f, v_r`` are
``weight_c`` viewed ``(2, dirs, hidden)``, ``b_f, b_r`` are ``bias`` viewed the same way.

Two implementations:

* the **fast path** (default): per layer one ``torch.autograd.Function`` (``SRULayerFunction``):
  one torch GEMM for all time steps, then compiled kernels for the recurrence, forward and
  backward (gradients for U, v_f, v_r, b, c0 and the highway input; the backward's two GEMMs are
  torch's, the highway gradient added inside one via ``addmm``). The kernels come from a backend
  chosen by the input's device: **CPU**: numba (``_sru_kernels``; float32/float64; large work
  buffers reused between calls; backward gradients below 1e-30 flushed to zero, as float32
  denormals are ~100x slower on CPU); **CUDA**: Triton (``_sru_triton``; float16/bfloat16/
  float32/float64 and autocast, state in float32 or float64, outputs in the reference path's
  dtypes; compiled and checked against the reference path on two tiny layers the first time each
  device / dtype / autocast dtype is used). Not twice differentiable.
* the **reference path**: plain PyTorch, a Python loop over time steps, device-agnostic: used on
  other devices, for dtypes the backend does not take, when the backend's library (numba, triton)
  cannot be imported or its self-test fails (these with a ``RuntimeWarning`` naming the reason),
  or when turned off with ``DYNTC_SRU_FAST=0`` / ``dyntc.core.encoders.sru.USE_FAST = False`` /
  ``forward(..., fast=False)``.
"""

from __future__ import annotations

import importlib
import math
import os
import warnings
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["SRU", "SRULayer", "from_sru", "fast_path_status", "USE_FAST"]

#: Module switch for the fast path: ``None`` = follow ``$DYNTC_SRU_FAST`` (default on),
#: ``True`` / ``False`` = force.
USE_FAST: bool | None = None

# device type -> (backend module, the library it needs, the dtypes its kernels take)
_BACKENDS: dict[str, tuple[str, str, tuple[torch.dtype, ...]]] = {
    "cpu": ("dyntc.core.encoders._sru_kernels", "numba", (torch.float32, torch.float64)),
    "cuda": ("dyntc.core.encoders._sru_triton", "triton", (torch.float16, torch.bfloat16, torch.float32, torch.float64)),
}
_loaded: dict[str, Any] = {}  # device type -> imported backend module
_load_errors: dict[str, str] = {}  # device type -> why its backend could not be imported
# CUDA: (device index, input dtype, autocast dtype or None) -> None when the Triton kernels passed
# their self-test for that case, else why they did not
_self_tests: dict[tuple, str | None] = {}


def _load_backend(device_type: str):
    """Import the kernels for `device_type` (lazily: importing numba costs ~0.5 s, triton more).
    Returns the module, or None with the reason in ``_load_errors``."""
    if device_type not in _loaded and device_type not in _load_errors:
        try:
            _loaded[device_type] = importlib.import_module(_BACKENDS[device_type][0])
        except Exception as exc:  # ImportError, or numba failing to initialise
            _load_errors[device_type] = f"{type(exc).__name__}: {exc}"
    return _loaded.get(device_type)


def _cuda_self_test(backend, x: Tensor) -> str | None:
    """Run (once per device, dtype and autocast dtype) the self-test of the Triton kernels for
    inputs like `x`: compiles the kernel variants a model uses, on the device it uses, so that a GPU,
    driver or dtype Triton cannot handle falls back here rather than failing mid-training.
    Returns None when they passed, else why not."""
    try:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    except Exception as exc:  # no CUDA in this build / driver
        return f"{type(exc).__name__}: {exc}"
    autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    key = (index, x.dtype, autocast)
    if key not in _self_tests:
        try:
            _self_test(backend, torch.device("cuda", index), x.dtype)
            _self_tests[key] = None
        except Exception as exc:  # a compile error, a driver error, or numbers that differ
            _self_tests[key] = f"{type(exc).__name__}: {exc}"
    return _self_tests[key]


def _self_test(backend, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Forward, backward and inference of two tiny layers through `backend`, against the reference
    path: K = 4 with a dropout mask, padding and c0, and K = 3 without them; every output and
    gradient compared. Runs with gradients on and full-precision matrix products whatever the
    caller's mode (a first use is often under ``torch.no_grad()`` / ``inference_mode``), under the
    caller's autocast state (so that the same kernel variants compile). Raises on a mismatch."""
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        with torch.inference_mode(False), torch.enable_grad():
            for n_in, masked in ((6, True), (4, False)):
                _self_test_layer(backend, device, dtype, n_in, masked)
    finally:
        torch.set_float32_matmul_precision(precision)


def _self_test_layer(backend, device: torch.device, dtype: torch.dtype, n_in: int, masked: bool) -> None:
    L, B, H = 3, 2, 4
    K = 3 if n_in == H else 4
    gen = torch.Generator().manual_seed(n_in)
    like = dict(device=device, dtype=dtype)
    x = torch.randn(L, B, n_in, generator=gen).to(**like)
    w = (torch.randn(n_in, H * K, generator=gen) * 0.5).to(**like)
    wc, b = torch.randn(2 * H, generator=gen).to(**like), torch.randn(2 * H, generator=gen).to(**like)
    c0 = torch.randn(B, 1, H, generator=gen).to(**like)
    mask_c = ((torch.rand(B, H, generator=gen) > 0.3).float() / 0.7).to(**like) if masked else None
    pad = torch.tensor([[False, False], [False, False], [False, True]], device=device) if masked else None
    scale = torch.tensor([1.3], **like)
    inputs = [t.requires_grad_() for t in (x, w, wc, b, c0)]
    h, c = SRULayerFunction.apply(x, w, wc, b, c0, mask_c, pad, None, scale, 1, H, K, backend)
    gh, gc = torch.randn(h.shape, generator=gen).to(h), torch.randn(c.shape, generator=gen).to(c)
    grads = torch.autograd.grad((h * gh).sum() + (c * gc).sum(), inputs)
    U = x.reshape(L * B, n_in).mm(w)
    h_ref, c_ref = _recurrence_reference(U, x, wc, b, c0, H, False, scale if K == 3 else None, mask_c, pad)
    grads_ref = torch.autograd.grad((h_ref * gh).sum() + (c_ref * gc).sum(), inputs)
    with torch.no_grad():
        h_inf, c_inf, _ = _layer_forward(x, w, wc, b, c0, None, pad, None, scale, 1, H, K, backend, False)
        h_inf_ref, c_inf_ref = _recurrence_reference(U, x, wc, b, c0, H, False, scale if K == 3 else None, None, pad)
    half = dtype in (torch.float16, torch.bfloat16) or U.dtype in (torch.float16, torch.bfloat16)
    tol = 3e-2 if half else 1e-4
    names = ["output", "c", "grad input", "grad weight", "grad weight_c", "grad bias", "grad c0",
             "inference output", "inference c"]  # fmt: skip
    pairs = [(h, h_ref), (c, c_ref), *zip(grads, grads_ref), (h_inf, h_inf_ref), (c_inf, c_inf_ref)]
    for name, (ours, ref) in zip(names, pairs):
        err = (ours.double() - ref.double()).abs().max().item()
        if ours.shape != ref.shape or ours.dtype != ref.dtype or not err <= tol * max(1.0, ref.abs().max().item()):
            raise RuntimeError(f"self-test (K = {K}, {dtype}): the kernels' {name} differs from the reference path "
                               f"({ours.dtype} {tuple(ours.shape)} vs {ref.dtype} {tuple(ref.shape)}, max diff {err:.3g})")


def _fast_enabled() -> bool:
    if USE_FAST is not None:
        return bool(USE_FAST)
    return os.environ.get("DYNTC_SRU_FAST", "1").strip().lower() not in ("0", "false", "no", "off")


def fast_path_status(x: Tensor | None = None) -> tuple[bool, str | None]:
    """``(use_fast, reason)``: whether the fast path applies to input `x` (default: a CPU float32
    tensor), and if not, why (``reason`` is None when the user turned it off: nothing to warn about)."""
    if not _fast_enabled():
        return False, None
    device_type = "cpu" if x is None else x.device.type
    if device_type not in _BACKENDS:
        return False, f"inputs are on {device_type} (fast kernels exist for cpu (numba) and cuda (Triton))"
    _, library, dtypes = _BACKENDS[device_type]
    if x is not None and x.dtype not in dtypes:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        return False, f"dtype {x.dtype} is not supported by the {library} kernels on {device_type} ({names})"
    backend = _load_backend(device_type)
    if backend is None:
        return False, f"{library} unavailable ({_load_errors[device_type]})"
    if device_type == "cuda" and x is not None:
        failed = _cuda_self_test(backend, x)
        if failed is not None:
            return False, f"the Triton kernels failed their self-test on {x.device} for {x.dtype} ({failed})"
    return True, None


def _use_fast_path(x: Tensor, fast: bool | None) -> bool:
    """Whether to run the fast path on `x`: never with ``fast=False``; otherwise when available,
    with a RuntimeWarning naming the reason when it is not (and was not turned off)."""
    if fast is False:
        return False
    use, reason = fast_path_status(x)
    if reason is not None:
        warnings.warn(f"dyntc SRU: using the reference PyTorch path because {reason}", RuntimeWarning, stacklevel=3)
    return use


def gate_major(weight: Tensor, D: int, H: int, K: int) -> Tensor:
    """`weight` (I, D*H*K) with its columns reordered from sru's (D, H, K) to (D, K, H), so that in
    ``U = x W`` each gate's row over the hidden units is contiguous (a copy, without autograd)."""
    return weight.detach().view(weight.shape[0], D, H, K).permute(0, 1, 3, 2).reshape(weight.shape[0], D * K * H)


def _layer_forward(x, weight, weight_c, bias, c0, mask_c, mask_pad, x_hw, scale, D, H, K, backend, train: bool,
                   wp: Tensor | None = None):  # fmt: skip
    """One layer forward on the fast path (see SRULayerFunction) -> h (T, B, D*H), c (B, D*H), and
    the tensors the backward needs when `train` (else None). Called directly, without autograd,
    for inference. `wp`: ``gate_major(weight)`` when the caller has it."""
    L, B, I = x.shape
    if wp is None:
        wp = gate_major(weight, D, H, K)
    x2 = x.detach().reshape(L * B, I)
    if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        U = torch.mm(x2, wp)  # in autocast's dtype (the Triton kernels take float16 / bfloat16)
    else:
        U = backend.empty((L * B, D * K * H), x.dtype, x.device)
        torch.mm(x2, wp, out=U)
    U = U.view(L, B, D, K, H)
    hw = (x if x_hw is None else x_hw) if K == 3 else None
    h, c_last, saved = backend.recurrence_forward(U, hw, scale, weight_c, bias, c0, mask_c, mask_pad, train)
    h, c_last = h.view(L, B, D * H), c_last.view(B, D * H)
    return h, c_last, ((x2, wp, *saved) if train else None)


class SRULayerFunction(torch.autograd.Function):
    """One SRU layer on the fast path, direction-stacked: the matrix product (torch) and the
    recurrence (the backend's kernels) in one node, so that the backward adds the highway gradient
    inside the GEMM (``addmm``) instead of in a separate pass.

    ``(x (T, B, I), weight (I, D*H*K) in sru's layout, weight_c, bias, c0 (B, D, H), mask_c,
    mask_pad, x_hw, scale, D, H, K, backend, wp=None) -> (h (T, B, D*H), c (B, D*H))``, where
    ``x_hw`` is the highway input when it differs from ``x`` (pre-layer-norm: x = LN(x_hw)), else
    None, ``backend`` the kernel module (``_sru_kernels`` or ``_sru_triton``) and ``wp`` the
    weight in ``gate_major`` order if the caller has it. Not twice differentiable."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, weight_c, bias, c0, mask_c, mask_pad, x_hw, scale, D, H, K, backend, wp=None):
        # (ctx.needs_input_grad does not see torch.no_grad(): callers use _layer_forward for that)
        h, c_last, saved = _layer_forward(x, weight, weight_c, bias, c0, mask_c, mask_pad, x_hw, scale, D, H, K, backend,
                                          True, wp)  # fmt: skip
        ctx.save_for_backward(*saved)
        ctx.dims = (*x.shape, D, H, K)
        ctx.hw_is_x = x_hw is None
        ctx.backend = backend
        return h, c_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, gh, gc_last):
        x2, wp, *saved = ctx.saved_tensors
        L, B, I, D, H, K = ctx.dims
        backend = ctx.backend
        gU, ghw, gwc, gbias, gc0 = backend.recurrence_backward(saved, gh, gc_last)
        gU2 = gU.view(L * B, D * K * H)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx = gw = g_xhw = None
        if need_x:
            if ghw is not None and ctx.hw_is_x and ghw.dtype == gU2.dtype == wp.dtype:
                gx = ghw.view(L * B, I).addmm_(gU2, wp.t()).view(L, B, I)  # highway + GEMM grads
            else:
                gx = backend.empty((L * B, I), gU2.dtype, gU2.device)
                torch.mm(gU2, wp.t().to(gU2.dtype), out=gx)
                gx = gx.view(L, B, I)
                if ghw is not None and ctx.hw_is_x:
                    gx = gx + ghw.view(L, B, I)
        if ghw is not None and not ctx.hw_is_x and ctx.needs_input_grad[7]:
            g_xhw = ghw.view(L, B, I)
        if need_w:
            gw = torch.mm(x2.t().to(gU2.dtype), gU2).view(I, D, K, H).permute(0, 1, 3, 2).reshape(I, D * H * K)
        return gx, gw, gwc, gbias, gc0, None, None, g_xhw, None, None, None, None, None, None


class SRULayer(nn.Module):
    """One SRU layer (``sru.SRUCell`` 2.6.0 with the options above); same parameter names."""

    scale_x: Tensor

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        dropout: float = 0.0,
        bidirectional: bool = False,
        layer_norm: bool = False,
        highway_bias: float = 0.0,
        rescale: bool = True,
    ):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = hidden_size * 2 if bidirectional else hidden_size
        self.num_directions = 2 if bidirectional else 1
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.highway_bias = highway_bias
        self.rescale = rescale
        self.num_matrices = 4 if input_size != self.output_size else 3
        self.weight = nn.Parameter(torch.empty(input_size, self.output_size * self.num_matrices))
        self.weight_c = nn.Parameter(torch.empty(2 * self.output_size))
        self.bias = nn.Parameter(torch.empty(2 * self.output_size))
        self.register_buffer("scale_x", torch.zeros(1))
        self.layer_norm: nn.LayerNorm | None = nn.LayerNorm(input_size) if layer_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """sru 2.6.0's initialisation, consuming the random generator in the same order."""
        with torch.no_grad():
            self.bias.zero_()
            self.bias[self.output_size :].add_(self.highway_bias)
            scale_val = (1 + math.exp(self.highway_bias) * 2) ** 0.5
            self.scale_x.fill_(scale_val if self.rescale else 1.0)
            d = self.weight.size(0)
            val_range = (3.0 / d) ** 0.5
            self.weight.uniform_(-val_range, val_range)
            w = self.weight.view(d, -1, self.hidden_size, self.num_matrices)
            if self.dropout > 0:
                w[:, :, :, 0].mul_((1 - self.dropout) ** 0.5)
            if self.layer_norm is not None:
                w.mul_(0.1)
            if self.rescale and self.num_matrices == 4:
                w[:, :, :, 3].mul_(scale_val)
            self.weight_c.uniform_(-(3.0**0.5), 3.0**0.5)
            self.weight_c.mul_(0.5**0.5)
            w[:, :, :, 1].mul_(0.5**0.5)
            w[:, :, :, 2].mul_(0.5**0.5)

    def _gate_major_weight(self) -> Tensor:
        """``gate_major(self.weight)``, cached until the weight changes: in place (its version
        counter: optimizer steps, ``load_state_dict``) or replaced / moved (its storage). Saves a
        copy of the weight per call, which dominates small inference batches."""
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self.__dict__.get("_gate_major_key") != key:
            with torch.inference_mode(False):  # a normal tensor: training may save it for backward
                self.__dict__["_gate_major"] = gate_major(w, self.num_directions, self.hidden_size, self.num_matrices)
            self.__dict__["_gate_major_key"] = key
        return self.__dict__["_gate_major"]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.dropout > 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.highway_bias != 0:
            s += f", highway_bias={self.highway_bias}"
        s += f", rescale={self.rescale}"
        if self.layer_norm is not None:
            s += ", layer_norm=True"
        return s

    def forward(
        self, input: Tensor, c0: Tensor | None = None, mask_pad: Tensor | None = None, *, fast: bool | None = None
    ) -> tuple[Tensor, Tensor]:
        """`input` (T, B, input_size), `c0` (B, output_size) -> h (T, B, output_size), c (B, output_size).

        `fast`: None = decide (fast path when available), False = reference path."""
        if input.dim() != 3:
            raise ValueError("input must be (length, batch_size, input_size)")
        length, batch, _ = input.shape
        D, H, K = self.num_directions, self.hidden_size, self.num_matrices
        if c0 is None:
            c0 = torch.zeros(batch, self.output_size, dtype=input.dtype, device=input.device)
        residual = input
        if self.layer_norm is not None:
            input = self.layer_norm(input)
        mask_c = None
        if self.training and self.dropout > 0:
            # same random-number use as sru 2.6.0 (variational mask, one per sequence)
            p = self.dropout
            mask_c = self.bias.data.new_empty((batch, self.output_size)).bernoulli_(1 - p).div_(1 - p)
        if mask_pad is not None:
            mask_pad = mask_pad.to(device=input.device, dtype=torch.bool)
            if mask_pad.shape != (length, batch):
                raise ValueError(f"mask_pad must be (length, batch_size) = {(length, batch)}, got {tuple(mask_pad.shape)}")
        if _use_fast_path(input, fast):
            scale = self.scale_x if self.rescale else 1.0  # (a tensor: no GPU sync here)
            args = (input, self.weight, self.weight_c, self.bias, c0.reshape(batch, D, H), mask_c, mask_pad,
                    residual if self.layer_norm is not None else None, scale, D, H, K)  # fmt: skip
            backend = _loaded[input.device.type]
            wp = self._gate_major_weight()
            if torch.is_grad_enabled() and any(
                t.requires_grad for t in (input, residual, c0, self.weight, self.weight_c, self.bias)
            ):
                return SRULayerFunction.apply(*args, backend, wp)
            h, c, _ = _layer_forward(*args, backend, False, wp)  # inference: no autograd node, nothing saved
            return h, c
        U = input.reshape(-1, self.input_size).mm(self.weight)
        return _recurrence_reference(
            U, residual, self.weight_c, self.bias, c0, H, self.bidirectional,
            self.scale_x if self.rescale else None, mask_c, mask_pad,
        )


def _recurrence_reference(
    U: Tensor,
    x: Tensor,
    weight_c: Tensor,
    bias: Tensor,
    c_init: Tensor,
    hidden_size: int,
    bidirectional: bool,
    scale_x: Tensor | None,
    mask_c: Tensor | None,
    mask_pad: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Pure-PyTorch recurrence (sru 2.6.0's ``elementwise_recurrence_naive``, device-agnostic)."""
    D = 2 if bidirectional else 1
    length, batch = x.shape[0], x.shape[1]
    d = hidden_size
    k = U.size(-1) // d // D
    U = U.contiguous().view(length, batch, D, d, k)
    forget_wc, reset_wc = weight_c.view(2, D, d)
    forget_bias, reset_bias = bias.view(2, D, d)
    if k == 3:
        x_prime = x.reshape(length, batch, D, d)
        x_prime = x_prime * scale_x if scale_x is not None else x_prime
    else:
        x_prime = U[..., 3]
    c_init = c_init.reshape(batch, D, d)
    keep = None if mask_pad is None else (~mask_pad).to(x.dtype).view(length, batch, 1).unbind(0)
    mask_c_ = None if mask_c is None else mask_c.view(batch, D, d)
    outs: list[Tensor] = []
    c_final = []
    for di in range(D):
        c_prev = c_init[:, di, :]
        fw, rw = forget_wc[di], reset_wc[di]
        # unbind (one backward node per tensor) rather than indexing [t] per step, whose backward
        # would materialise a full (T, B, H) gradient for every step
        u0 = U[:, :, di, :, 0].unbind(0)
        u1 = (U[:, :, di, :, 1] + forget_bias[di]).unbind(0)
        u2 = (U[:, :, di, :, 2] + reset_bias[di]).unbind(0)
        xp = x_prime[:, :, di, :].unbind(0)
        steps = range(length) if di == 0 else range(length - 1, -1, -1)
        hs: list[Tensor | None] = [None] * length
        for t in steps:
            f = torch.sigmoid(u1[t] + c_prev * fw)
            r = torch.sigmoid(u2[t] + c_prev * rw)
            c_t = u0[t] + (c_prev - u0[t]) * f
            if keep is not None:
                c_t = torch.where(keep[t] > 0, c_t, c_prev)
            g = (c_t - xp[t]) * r if mask_c_ is None else (c_t - xp[t]) * mask_c_[:, di, :] * r
            h_t = xp[t] + g
            if keep is not None:
                h_t = h_t * keep[t]
            hs[t] = h_t
            c_prev = c_t
        outs.append(torch.stack(hs))  # type: ignore[arg-type]
        c_final.append(c_prev)
    h = outs[0] if D == 1 else torch.stack(outs, dim=2)
    return h.reshape(length, batch, D * d), torch.stack(c_final, dim=1).reshape(batch, D * d)


class SRU(nn.Module):
    """A stack of SRU layers with ``sru.SRU`` 2.6.0's interface, parameter names and numbers.

    ``forward(input (T, B, input_size), c0 (num_layers, B, out) = None, mask_pad (T, B) = None)``
    -> ``(output (T, B, out), c (num_layers, B, out))`` with ``out = hidden_size * dirs``;
    ``mask_pad`` is non-zero at padding. ``dropout`` is sru's: a per-sequence mask on the
    recurrent term of every layer but the last, in training mode only.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        bidirectional: bool = False,
        layer_norm: bool = False,
        highway_bias: float = 0.0,
        rescale: bool = True,
    ):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.num_directions
        self.use_layer_norm = layer_norm
        self.highway_bias = highway_bias
        self.rescale = rescale
        self.rnn_lst = nn.ModuleList(
            SRULayer(
                input_size if i == 0 else self.output_size,
                hidden_size,
                dropout=dropout if i + 1 != num_layers else 0.0,
                bidirectional=bidirectional,
                layer_norm=layer_norm,
                highway_bias=highway_bias,
                rescale=rescale,
            )
            for i in range(num_layers)
        )

    def reset_parameters(self) -> None:
        for layer in self.rnn_lst:
            layer.reset_parameters()

    def forward(
        self, input: Tensor, c0: Tensor | None = None, mask_pad: Tensor | None = None, *, fast: bool | None = None
    ) -> tuple[Tensor, Tensor]:
        if input.dim() != 3:
            raise ValueError("input must be (length, batch_size, input_size)")
        if c0 is not None and c0.dim() != 3:
            raise ValueError("c0 must be (num_layers, batch_size, output_size)")
        fast = _use_fast_path(input, fast)  # decided (and warned about) once for all layers
        prevx = input
        cs = []
        for i, layer in enumerate(self.rnn_lst):
            prevx, c = layer(prevx, None if c0 is None else c0[i], mask_pad, fast=fast)
            cs.append(c)
        return prevx, torch.stack(cs)

    def load_sru_state_dict(self, state_dict: dict[str, Tensor], strict: bool = True):
        """Load an ``sru.SRU`` 2.6.0 state dict (same keys: ``rnn_lst.{i}.weight``, ``weight_c``,
        ``bias``, ``scale_x``, ``layer_norm.*``)."""
        own = self.state_dict()
        for key, value in state_dict.items():
            if key in own and own[key].shape != value.shape:
                raise ValueError(f"{key}: shape {tuple(value.shape)} in the sru state dict, {tuple(own[key].shape)} here")
        return self.load_state_dict(state_dict, strict=strict)


def from_sru(module: nn.Module) -> SRU:
    """An ``SRU`` with the configuration and weights of an ``sru.SRU`` 2.6.0 module."""
    cells = list(module.rnn_lst)
    cell0 = cells[0]
    unsupported = {
        "projection_size": getattr(module, "projection_size", 0) != 0,
        "rnn_dropout": getattr(module, "rnn_dropout", 0) != 0,
        "has_skip_term=False": not getattr(module, "has_skip_term", True),
        "use_tanh": getattr(cell0, "activation_type", 0) != 0,
        "v1": getattr(cell0, "v1", False),
        "custom_m": getattr(cell0, "custom_m", None) is not None,
        "normalize_after": getattr(cell0, "normalize_after", False) and cell0.layer_norm is not None,
        "proj_input_to_hidden_first": getattr(module, "input_to_hidden", None) is not None,
        "nn_rnn_compatible_return": getattr(module, "nn_rnn_compatible_return", False),
    }
    bad = [name for name, flag in unsupported.items() if flag]
    if bad:
        raise ValueError(f"sru options not supported by dyntc's SRU: {', '.join(bad)}")
    out = SRU(
        module.input_size,
        module.hidden_size,
        num_layers=module.num_layers,
        dropout=module.dropout,
        bidirectional=module.bidirectional,
        layer_norm=module.use_layer_norm,
        highway_bias=cell0.highway_bias,
        rescale=cell0.rescale,
    )
    out.load_sru_state_dict(module.state_dict())
    out.to(device=cell0.weight.device, dtype=cell0.weight.dtype)
    out.train(module.training)
    return out
