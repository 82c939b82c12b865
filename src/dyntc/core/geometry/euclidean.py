"""Euclidean geometry for prototypical networks: squared distances and (weighted) means.

Shapes follow the batched convention of the rest of :mod:`dyntc.core.geometry`: a set of points is
``(..., n, d)``; leading dimensions are batch dimensions (e.g. one set per class).
"""

from __future__ import annotations

import torch

from dyntc.errors import DyntcError

__all__ = ["sq_distance_matrix", "mean"]


def sq_distance_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """All squared Euclidean distances between the rows of ``a`` and ``b``.

    ``D[..., i, j] = |a_i - b_j|² = |a_i|² + |b_j|² - 2 <a_i, b_j>``

    The expansion needs one matmul (fast for queries × prototypes) but can round to a small negative
    value when ``a_i ≈ b_j``; the result is clamped at 0. The gradient of the expansion is
    ``2(a_i - b_j)``, so it is finite (≈ 0) for coincident rows.

    a: ``(..., n, d)``, b: ``(..., m, d)`` (batch dims broadcast) -> ``(..., n, m)``.
    """
    a2 = (a * a).sum(-1).unsqueeze(-1)
    b2 = (b * b).sum(-1).unsqueeze(-2)
    return (a2 + b2 - 2.0 * (a @ b.mT)).clamp_min(0.0)


def _check_weights(weights, points: torch.Tensor) -> torch.Tensor:
    """Validate ``weights`` for a set ``points`` of shape ``(..., n, dim)``.

    Returns the weights broadcast to ``points.shape[:-1]`` in the points' dtype and device.
    Raises :class:`~dyntc.errors.DyntcError` (a ``ValueError``) if they are not finite, negative,
    or all zero for some set.
    """
    w = torch.as_tensor(weights, dtype=points.dtype, device=points.device)
    try:
        w = torch.broadcast_to(w, points.shape[:-1])
    except RuntimeError:
        raise DyntcError(
            f"`weights` of shape {tuple(w.shape)} does not broadcast to the points' {tuple(points.shape[:-1])}"
        ) from None
    wd = w.detach()
    if not bool(torch.isfinite(wd).all()):
        raise DyntcError("`weights` must be finite")
    if bool((wd < 0).any()):
        raise DyntcError("`weights` must be non-negative")
    if w.shape[-1] == 0 or bool((wd.sum(-1) <= 0).any()):
        raise DyntcError("`weights` must not be all zero for any set of points (each set needs a positive weight)")
    return w


def mean(points: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """(Weighted) arithmetic mean of each set: ``sum_i w_i x_i / sum_i w_i``.

    points: ``(..., n, d)``; weights: optional ``(..., n)``, non-negative, not all zero per set
    (zero weights mask padded points). Returns ``(..., d)``.
    """
    if points.shape[-2] == 0:
        raise DyntcError("cannot average an empty set of points")
    if weights is None:
        return points.mean(-2)
    w = _check_weights(weights, points)
    w = w / w.sum(-1, keepdim=True)
    return (w.unsqueeze(-2) @ points).squeeze(-2)
