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

* the **fast path** (CPU, float32/float64; default): per layer one ``torch.autograd.Function``
  (``_sru_kernels.SRULayerFunction``): one torch GEMM for all time steps, then numba kernels for
  the recurrence, forward and backward (gradients for U, v_f, v_r, b, c0 and the highway input;
  the backward's two GEMMs are torch's, the highway gradient added inside one via ``addmm``).
  Large work buffers are reused between calls. Backward gradients below 1e-30 in magnitude are
  flushed to zero (they would be float32 denormals, ~100x slower on CPU). Not twice
  differentiable.
* the **reference path**: plain PyTorch, a Python loop over time steps, device-agnostic: used on
  CUDA (and other non-CPU devices), for dtypes other than float32/float64, when numba cannot be
  imported (these three with a ``RuntimeWarning`` naming the reason), or when turned off with
  ``DYNTC_SRU_FAST=0`` / ``dyntc.encoders.sru.USE_FAST = False`` / ``forward(..., fast=False)``.
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

#: Module switch for the fast CPU path: ``None`` = follow ``$DYNTC_SRU_FAST`` (default on),
#: ``True`` / ``False`` = force.
USE_FAST: bool | None = None

_kernels: Any = None  # the imported _sru_kernels module, once loaded
_kernels_error: str | None = None  # why it could not be loaded


def _load_kernels():
    """Import the numba kernels (lazily: importing numba costs ~0.5 s). Returns the module or None."""
    global _kernels, _kernels_error
    if _kernels is None and _kernels_error is None:
        try:
            _kernels = importlib.import_module("dyntc.encoders._sru_kernels")
        except Exception as exc:  # ImportError, or numba failing to initialise
            _kernels_error = f"{type(exc).__name__}: {exc}"
    return _kernels


def _fast_enabled() -> bool:
    if USE_FAST is not None:
        return bool(USE_FAST)
    return os.environ.get("DYNTC_SRU_FAST", "1").strip().lower() not in ("0", "false", "no", "off")


def fast_path_status(x: Tensor | None = None) -> tuple[bool, str | None]:
    """``(use_fast, reason)``: whether the fast path applies to input `x`, and if not, why
    (``reason`` is None when the user turned it off, i.e. nothing to warn about)."""
    if not _fast_enabled():
        return False, None
    if x is not None:
        if x.device.type != "cpu":
            return False, f"inputs are on {x.device.type} (the numba kernels are CPU-only)"
        if x.dtype not in (torch.float32, torch.float64):
            return False, f"dtype {x.dtype} is not supported by the numba kernels (float32/float64)"
    if _load_kernels() is None:
        return False, f"numba unavailable ({_kernels_error})"
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
            scale = float(self.scale_x.item()) if self.rescale else 1.0
            args = (input, self.weight, self.weight_c, self.bias, c0.reshape(batch, D, H), mask_c, mask_pad,
                    residual if self.layer_norm is not None else None, scale, D, H, K)  # fmt: skip
            if torch.is_grad_enabled() and any(
                t.requires_grad for t in (input, residual, c0, self.weight, self.weight_c, self.bias)
            ):
                return _kernels.SRULayerFunction.apply(*args)
            h, c, _ = _kernels.layer_forward(*args, False)  # inference: no autograd node, nothing saved
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
