r"""Hyperboloid (Lorentz) model of hyperbolic space with curvature -1.

Conventions are the paper's (Wohlwend et al. 2019, sign convention of Sala et al. 2018)::

    B(x, y) = x0 y0 - sum_{i>=1} xi yi                  (Lorentz bilinear form)
    H^d     = {x in R^{d+1} : B(x, x) = 1, x0 > 0}       (upper sheet of the hyperboloid)
    d(x, y) = arccosh(B(x, y))                           (geodesic distance)

The tangent space at ``x`` is ``T_x H = {v : B(x, v) = 0}``; tangent vectors are space-like
(``B(v, v) <= 0``) and the Riemannian metric is ``<u, v>_x = -B(u, v)``, ``|v| = sqrt(-B(v, v))``.

Numerics. Every distance-like quantity is computed from ``t = B(x, y) - 1 >= 0`` (so that
``d = arccosh(1 + t)``), never from ``B`` itself:

* The pairwise functions (:func:`distance`, :func:`sq_distance`, :func:`log_map`) take ``t`` as
  ``B(x, y) - 1`` or, for nearby points, as ``-B(x - y, x - y) / 2`` (equal on the hyperboloid);
  the second has a rounding error proportional to ``|x - y|²`` instead of ``x0 y0``, which gives
  accurate small distances and ``d(x, x) = 0`` exactly. :func:`sq_distance_matrix` and the mean
  solver take ``B`` from a matmul (speed); their small distances carry an error ~ ``eps x0 y0``.
* ``arccosh(1 + t) = log1p(t + sqrt(t) sqrt(t + 2))`` is accurate for small ``t`` and does not
  overflow for large ``t``.
* Functions with a removable singularity at ``t = 0`` (``arccosh(1+t)²``, ``d / sinh d``,
  ``sinh|v| / |v|``, ``d coth d``) switch to their Taylor series below a threshold, with the
  "double where" trick so that neither branch produces inf/NaN values or gradients. They are
  therefore smooth (differentiable to any order) everywhere, including at coincident points.

All functions broadcast over leading dimensions. Points are ``(..., d+1)``.
"""

from __future__ import annotations

import importlib
import os
import warnings

import torch

from dyntc.errors import DyntcError, is_int, is_number
from dyntc.core.geometry.euclidean import _check_weights

__all__ = [
    "project",
    "inner",
    "distance",
    "sq_distance",
    "sq_distance_matrix",
    "exp_map",
    "log_map",
    "tangent_project",
    "to_poincare",
    "from_poincare",
    "normalized_euclidean_mean",
    "frechet_mean",
    "paper_mean",
]

# ---------------------------------------------------------------------------------------------
# Scalar helpers: smooth functions of t = B(x, y) - 1 >= 0 (or of s = d² / q = |v|²)
# ---------------------------------------------------------------------------------------------

# The series thresholds and coefficients, and the step-search constants, live in _lorentz_series so
# that the numba kernels (_lorentz_kernels) read the same numbers without importing this module.
from dyntc.core.geometry._lorentz_series import (  # noqa: E402
    _ACOSH_SQ, _ARMIJO_C1, _COSH, _D_OVER_SINH, _KAPPA, _MAX_HALVINGS, _Q_SERIES, _SINHC, _T_SERIES,
)


def _poly(x: torch.Tensor, coefs: list[float]) -> torch.Tensor:
    """Horner evaluation of ``sum_k coefs[k] x^k``."""
    out = torch.full_like(x, coefs[-1])
    for c in reversed(coefs[:-1]):
        out = out * x + c
    return out


def _split(x: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(small, x_small, x_big)``: a mask and two inputs, each safe for its branch (double where)."""
    small = x < threshold
    x_small = torch.where(small, x, torch.zeros_like(x))
    x_big = torch.where(small, torch.full_like(x, threshold), x)
    return small, x_small, x_big


def _acosh1p(t: torch.Tensor) -> torch.Tensor:
    """``arccosh(1 + t) = log1p(t + sqrt(t) sqrt(t + 2))`` for ``t >= 0`` (no cancellation, no overflow).

    Its derivative is infinite at ``t = 0``; use :func:`_acosh1p_sq` where gradients can reach 0.
    """
    return torch.log1p(t + t.sqrt() * (t + 2.0).sqrt())


def _acosh1p_sq(t: torch.Tensor) -> torch.Tensor:
    """``arccosh(1 + t)²``, smooth at ``t = 0`` (value 0, derivative 2)."""
    small, ts, tb = _split(t, _T_SERIES)
    return torch.where(small, ts * _poly(ts, _ACOSH_SQ), _acosh1p(tb).square())


def _d_over_sinh(t: torch.Tensor) -> torch.Tensor:
    """``d / sinh d`` with ``d = arccosh(1 + t)``, smooth at ``t = 0`` (value 1)."""
    small, ts, tb = _split(t, _T_SERIES)
    big = _acosh1p(tb) / (tb.sqrt() * (tb + 2.0).sqrt())
    return torch.where(small, _poly(ts, _D_OVER_SINH), big)


def _kappa(s: torch.Tensor) -> torch.Tensor:
    """``(d coth d - 1) / d²`` as a function of ``s = d² >= 0``, smooth at 0 (value 1/3)."""
    small, ss, sb = _split(s, _Q_SERIES)
    d = sb.sqrt()
    return torch.where(small, _poly(ss, _KAPPA), (d / torch.tanh(d) - 1.0) / sb)


def _t(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``t = B(x, y) - 1 >= 0`` (so ``d(x, y) = arccosh(1 + t)``), computed the accurate way.

    On the hyperboloid ``B(x, y) - 1 = -B(x - y, x - y) / 2``. The rounding error of the direct form
    is about ``eps x0 y0``, that of the difference form about ``eps |x - y|²``: take the smaller.
    The result is clamped at 0 (``B >= 1`` for points on the hyperboloid).
    """
    u = x - y
    us2 = u[..., 1:].square().sum(-1)
    u02 = u[..., 0].square()
    t_diff = 0.5 * (us2 - u02)
    t_direct = inner(x, y) - 1.0
    near = (us2 + u02) <= 2.0 * (x[..., 0] * y[..., 0]).abs()
    return torch.where(near, t_diff, t_direct).clamp_min(0.0)


def _flip(x: torch.Tensor) -> torch.Tensor:
    """``J x`` with ``J = diag(1, -1, ..., -1)``, so that ``B(x, y) = x · J y``."""
    return torch.cat([x[..., :1], -x[..., 1:]], dim=-1)


# ---------------------------------------------------------------------------------------------
# Basic operations
# ---------------------------------------------------------------------------------------------


def project(h: torch.Tensor) -> torch.Tensor:
    """Lift a Euclidean vector onto the hyperboloid (paper eq. 7).

    ``h (..., d) -> x = (sqrt(1 + |h|²), h) (..., d+1)``, so that ``B(x, x) = 1``, ``x0 > 0``.
    """
    x0 = torch.sqrt(1.0 + h.square().sum(-1, keepdim=True))
    return torch.cat([x0, h], dim=-1)


def _renormalise(x: torch.Tensor) -> torch.Tensor:
    """Put ``x`` back on the hyperboloid by recomputing ``x0`` from the spatial part."""
    return project(x[..., 1:])


def inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Lorentz bilinear form ``B(x, y) = x0 y0 - sum_i xi yi`` (broadcasting) -> ``(...)``."""
    return x[..., 0] * y[..., 0] - (x[..., 1:] * y[..., 1:]).sum(-1)


def distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Geodesic distance ``d(x, y) = arccosh(B(x, y))`` (broadcasting) -> ``(...)``.

    Computed as ``arccosh(1 + t)`` with the accurate ``t = B - 1 >= 0`` (see module docstring).
    Identical points give exactly 0. The distance is not differentiable where ``x = y``
    (``arccosh'(1) = inf``, like ``|x - y|`` in Euclidean space); there the gradient is defined
    as 0, elsewhere it is the true (finite) gradient. Prefer :func:`sq_distance` for losses.
    """
    t = _t(x, y)
    pos = t > 0
    safe = torch.where(pos, t, torch.ones_like(t))
    return torch.where(pos, _acosh1p(safe), torch.zeros_like(t))


def sq_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Squared geodesic distance ``arccosh(B(x, y))²`` (broadcasting) -> ``(...)``.

    Smooth everywhere: near ``B = 1`` it uses the series ``2t - t²/3 + 4t³/45 - ...`` in
    ``t = B - 1`` (derivative 2 at ``t = 0``, as in the paper's L'Hôpital argument). For all pairs
    of two sets use :func:`sq_distance_matrix` (one matmul, no ``(n, m, d)`` intermediate).
    """
    return _acosh1p_sq(_t(x, y))


def sq_distance_matrix(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """All squared distances ``D[..., i, j] = arccosh(B(x_i, p_j))²`` -> ``(..., n, m)``.

    x: ``(..., n, d+1)``, p: ``(..., m, d+1)`` on the hyperboloid (batch dims broadcast). The
    training loss's hot path: ``B = x @ (J p)ᵀ`` is one matmul in the input dtype, then
    ``t = max(B - 1, 0)`` and the smooth ``arccosh(1 + t)²`` (gradient 2 at ``t = 0``, so finite
    for ``x_i = p_j``; no overflow for distances far beyond 30 in float32 since
    ``sqrt(t) sqrt(t + 2)`` replaces ``sqrt(B² - 1)``). Small distances carry an absolute error
    of about ``eps x0 p0`` in ``B``, the price of the matmul.
    """
    b = x @ _flip(p).mT
    return _acosh1p_sq((b - 1.0).clamp_min(0.0))


def tangent_project(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Orthogonal projection of an ambient vector ``u`` onto ``T_x H``: ``u - B(x, u) x``.

    With ``B(x, x) = 1``: ``B(x, u - B(x, u) x) = B(x, u) - B(x, u) B(x, x) = 0``. (With this
    sign convention it is a minus sign; geoopt's ``u + <x, u>_L x`` uses ``<.,.>_L = -B``.)
    """
    return u - inner(x, u).unsqueeze(-1) * x


def exp_map(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exponential map at ``x`` of a tangent vector ``v`` (``B(x, v) = 0``).

    ``exp_x(v) = cosh(|v|) x + sinh(|v|) v / |v|``, ``|v| = sqrt(-B(v, v))``; for small ``|v|``
    the series of ``cosh`` and ``sinh(n)/n`` in ``|v|²`` are used (smooth at ``v = 0``). The
    result is put back on the hyperboloid by recomputing its time coordinate ``x0``.
    """
    q = (-inner(v, v)).clamp_min(0.0)
    small, qs, qb = _split(q, _Q_SERIES)
    n = qb.sqrt()
    c = torch.where(small, _poly(qs, _COSH), torch.cosh(n))
    s = torch.where(small, _poly(qs, _SINHC), torch.sinh(n) / n)
    return _renormalise(c.unsqueeze(-1) * x + s.unsqueeze(-1) * v)


def log_map(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Logarithmic map: the tangent vector at ``x`` pointing to ``y`` with length ``d(x, y)``.

    ``log_x(y) = d / sinh(d) * (y - B(x, y) x)``, ``d = arccosh(B(x, y))``: ``y - B x`` is tangent
    (``B(x, y - B x) = 0``) with length ``sqrt(B² - 1) = sinh d``. Written as
    ``(d / sinh d) ((y - x) - t x)`` with the accurate ``t = B - 1``; ``d / sinh d`` uses its series
    near ``t = 0``, so the map is smooth at ``y = x`` (where it is 0).
    """
    t = _t(x, y)
    return _d_over_sinh(t).unsqueeze(-1) * ((y - x) - t.unsqueeze(-1) * x)


def to_poincare(x: torch.Tensor) -> torch.Tensor:
    """Hyperboloid -> Poincaré ball: ``x_{1:} / (1 + x0)``, ``(..., d+1) -> (..., d)``."""
    return x[..., 1:] / (1.0 + x[..., :1])


def from_poincare(p: torch.Tensor) -> torch.Tensor:
    """Poincaré ball -> hyperboloid: ``((1 + |p|²), 2p) / (1 - |p|²)``, ``(..., d) -> (..., d+1)``.

    Computed as ``project(2p / (1 - |p|²))``, which equals the formula and lies on the hyperboloid.
    """
    return project(2.0 * p / (1.0 - p.square().sum(-1, keepdim=True)))


# ---------------------------------------------------------------------------------------------
# Means
# ---------------------------------------------------------------------------------------------


def _normalised_weights(weights, points: torch.Tensor) -> torch.Tensor:
    if not points.dtype.is_floating_point:
        raise DyntcError(f"points must be a floating-point tensor, got {points.dtype}: convert them with .double()")
    if points.shape[-2] == 0:
        raise DyntcError("cannot average an empty set of points")
    if weights is None:
        return torch.full(points.shape[:-1], 1.0 / points.shape[-2], dtype=points.dtype, device=points.device)
    w = _check_weights(weights, points)
    return w / w.sum(-1, keepdim=True)


def normalized_euclidean_mean(points: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Closed-form approximate mean ``p̃`` (paper eq. 8): the Euclidean mean rescaled onto H.

    ``x̄ = sum_i w_i x_i / sum_i w_i``, ``p̃ = x̄ / sqrt(B(x̄, x̄))``. For points on the upper sheet
    ``B(x_i, x_j) >= 1``, hence ``B(x̄, x̄) >= 1``; it is clamped at 1 against rounding, and ``p̃0``
    is recomputed from the spatial part. Differentiable. points ``(..., n, d+1)`` -> ``(..., d+1)``.
    It is not the Fréchet mean (paper appendix "Two Differing Means").
    """
    w = _normalised_weights(weights, points)
    xbar = (w.unsqueeze(-2) @ points).squeeze(-2)
    scale = inner(xbar, xbar).clamp_min(1.0).rsqrt()
    return project(xbar[..., 1:] * scale.unsqueeze(-1))


def _combine(x: torch.Tensor, p: torch.Tensor, coef: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_i coef_i (x_i - b_i p)`` projected onto ``T_p`` (``b_i = B(p, x_i)``), for ``x (C, n, D)``.

    With ``coef_i = c_i g_i``, ``g_i = d_i / sinh d_i``, this is ``sum_i c_i log_p(x_i)``: one
    batched vector-matrix product, without materialising the ``(C, n, D)`` log maps.
    """
    v = (coef.unsqueeze(-2) @ x).squeeze(-2) - (coef * b).sum(-1, keepdim=True) * p
    return tangent_project(p, v)


def _evaluate(p: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Objective state at ``p (C, D)`` for sets ``x (C, n, D)`` with normalised weights ``w (C, n)``.

    ``b_i = B(p, x_i)``, ``t_i = b_i - 1``, ``sq_i = d_i²``, ``g_i = d_i / sinh d_i`` (so that
    ``log_p(x_i) = g_i (x_i - b_i p)``), ``F = sum_i w_i d_i²``, ``r = sum_i w_i log_p(x_i) =
    -grad F / 2`` and ``gnorm = |grad F| = 2 |r|``. Two batched matrix-vector products over ``x``.
    ``t`` is taken directly as ``B - 1`` (error ~ eps p0 x0, which moves ``log_p(x_i)`` by only
    ~ eps x0² |p|).
    """
    b = (x @ _flip(p).unsqueeze(-1)).squeeze(-1)
    t = (b - 1.0).clamp_min(0.0)
    sq = _acosh1p_sq(t)
    g = _d_over_sinh(t)
    r = _combine(x, p, w * g, b)
    return {
        "p": p,
        "b": b,
        "sq": sq,
        "g": g,
        "r": r,
        "F": (w * sq).sum(-1),
        "gnorm": 2.0 * (-inner(r, r)).clamp_min(0.0).sqrt() + 0.0,
    }


def _newton_direction(
    st: dict[str, torch.Tensor], x: torch.Tensor, G: torch.Tensor | None, w: torch.Tensor, r: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Riemannian Newton direction ``v = H⁻¹ r`` for ``F / 2`` at ``st["p"]``, and ``<grad F, v>``.

    In curvature -1 the Hessian of ``d(·, x)² / 2`` at ``p`` is ``1`` along the geodesic to ``x``
    and ``ζ = d coth d`` across it: ``ζ I - (ζ - 1) u uᵀ`` with ``u = l / d``, ``l = log_p(x)``.
    Hence, with ``κ = (ζ - 1) / d²`` (smooth in ``d²``),

        H = a I - sum_i k_i l_i l_iᵀ,   a = sum_i w_i ζ_i,   k_i = w_i κ_i,

    whose eigenvalues are >= sum_i w_i = 1 (each term's are >= w_i). Solved in whichever space is
    smaller, both by Cholesky of an SPD matrix:

    * ``n <= d + 1`` points (Woodbury): ``v = (r + sum_i k_i α_i l_i) / a`` where
      ``(a I - M K) α = (<l_j, r>)_j``, ``M_ij = <l_i, l_j> = g_i g_j (b_i b_j - B(x_i, x_j))`` from
      the fixed Lorentz Gram matrix ``G`` of the points; solved in the symmetric form
      ``(a I - K^½ M K^½) K^½ α = K^½ (<l_j, r>)``.
    * more points than ambient dimensions (``G`` not needed, may be None): in ambient coordinates
      ``H u = a u + L K Lᵀ J u`` (``L = [l_i]``, ``J = diag(1, -1, ..)``, ``<u, v> = -uᵀ J v``),
      which keeps ``T_p`` and ``p`` invariant. ``S = -a J - (J L) K (J L)ᵀ + 2a (J p)(J p)ᵀ`` is
      symmetric, equals ``-J H`` on ``T_p`` (where ``B(p, ·) = 0``) with ``uᵀ S u = <u, H u> > 0``,
      and is ``a`` along ``p``: SPD. ``S v = -J r`` gives ``v = H⁻¹ r``, in ``T_p``.

    A set whose factorisation fails (only for rounding-dominated systems, points ~15+ from the
    origin) falls back to ``v = r / a``, still a descent direction. ``r`` may be given (with
    autograd) to apply a fixed ``H⁻¹``.
    """
    p, b, g, sq = st["p"], st["b"], st["g"], st["sq"]
    r = st["r"] if r is None else r
    n, N = x.shape[-2], x.shape[-1]
    kappa = _kappa(sq)
    a = (w * (1.0 + sq * kappa)).sum(-1)
    k = w * kappa
    if n <= N:
        M = (g.unsqueeze(-1) * g.unsqueeze(-2)) * (b.unsqueeze(-1) * b.unsqueeze(-2) - G)
        lr = -g * (x @ _flip(r).unsqueeze(-1)).squeeze(-1)  # <l_i, r> = -g_i B(x_i, r), as B(p, r) = 0
        kh = k.sqrt()
        eye = torch.eye(n, dtype=M.dtype, device=M.device)
        A = a[:, None, None] * eye - kh.unsqueeze(-1) * M * kh.unsqueeze(-2)
        chol, info = torch.linalg.cholesky_ex(A)
        beta = torch.cholesky_solve((kh * lr).unsqueeze(-1), chol).squeeze(-1)
        good = (info == 0) & torch.isfinite(beta).all(-1)
        beta = torch.where(good.unsqueeze(-1), beta, torch.zeros_like(beta))
        v = (r + _combine(x, p, kh * beta * g, b)) / a.unsqueeze(-1)
    else:
        JL = _flip(g.unsqueeze(-1) * (x - b.unsqueeze(-1) * p.unsqueeze(-2)))  # rows J l_i, (C, n, N)
        Jp = _flip(p)
        J = torch.ones(N, dtype=x.dtype, device=x.device)
        J[1:] = -1.0
        S = (JL.mT * k.unsqueeze(-2)) @ JL
        S = 2.0 * a[:, None, None] * Jp.unsqueeze(-1) * Jp.unsqueeze(-2) - S - torch.diag_embed(a.unsqueeze(-1) * J)
        chol, info = torch.linalg.cholesky_ex(S)
        v = torch.cholesky_solve(-_flip(r).unsqueeze(-1), chol).squeeze(-1)
        good = (info == 0) & torch.isfinite(v).all(-1)
        v = torch.where(good.unsqueeze(-1), tangent_project(p, v), r / a.unsqueeze(-1))
    return v, 2.0 * inner(r, v)  # <grad F, v> = -2 <r, v> = 2 B(r, v)


def _solve(x: torch.Tensor, w: torch.Tensor, max_iter: int, tol: float):
    """Damped Riemannian Newton iterations (see :func:`frechet_mean`), without autograd."""
    C = x.shape[0]
    # B(x_i, x_j), fixed; only the Woodbury form of the Newton step needs it
    G = x @ _flip(x).mT if x.shape[-2] <= x.shape[-1] else None
    st = _evaluate(normalized_euclidean_mean(x, w), x, w)
    active = st["gnorm"] >= tol
    stalled = torch.zeros_like(active)
    iterations = 0
    while iterations < max_iter and bool(active.any()):
        iterations += 1
        v, slope = _newton_direction(st, x, G, w)
        vnorm = (-inner(v, v)).clamp_min(0.0).sqrt()
        s = torch.ones(C, dtype=x.dtype, device=x.device)
        pending = active.clone()
        new = dict(st)
        for _ in range(_MAX_HALVINGS):
            q = exp_map(st["p"], s.unsqueeze(-1) * v)
            cand = _evaluate(q, x, w)
            # slope of F along the geodesic at q: <grad F(q), γ'(s)> = 2 B(r(q), γ'(s)),
            # γ'(s) = |v| sinh(s|v|) p + cosh(s|v|) v  (velocity of s -> exp_p(s v))
            sn = (s * vnorm).unsqueeze(-1)
            vel = vnorm.unsqueeze(-1) * torch.sinh(sn) * st["p"] + torch.cosh(sn) * v
            slope_s = 2.0 * inner(cand["r"], vel)
            armijo = cand["F"] <= st["F"] + _ARMIJO_C1 * s * slope
            ok = pending & (armijo | (slope_s <= 0.5 * s * vnorm.square()))
            for key, val in cand.items():
                new[key] = torch.where(ok.view((C,) + (1,) * (val.dim() - 1)), val, new[key])
            pending = pending & ~ok
            if not bool(pending.any()):
                break
            s = torch.where(pending, 0.5 * s, s)
        stalled |= pending  # no acceptable step: F cannot be decreased in floating point
        st = new
        active = active & ~pending & (st["gnorm"] >= tol)
    return st, G, iterations, stalled


#: Switch for the compiled (numba) CPU solver of :func:`frechet_mean`: ``None`` = follow
#: ``$DYNTC_FRECHET_FAST`` (default on), ``True`` / ``False`` = force.
USE_COMPILED: bool | None = None
_compiled_error: str | None = None  # why the numba solver could not be loaded, once tried


#: Sets larger than this go to the PyTorch solver even on CPU: the kernel's Newton system is n x n
#: per set (plain loops), the PyTorch solver's at most (d+1) x (d+1) (`python -m bench.frechet`: 10 sets
#: x 128 points x 128 dims 12 ms compiled vs 25 ms PyTorch; x 256 points 99 ms vs 29 ms).
COMPILED_MAX_POINTS = 128


def _compiled_solver(x: torch.Tensor):
    """The numba solver module for CPU tensors of sets of at most COMPILED_MAX_POINTS points when
    enabled and importable, else None (the batched PyTorch solver; with a warning naming the
    reason if numba fails to load)."""
    global _compiled_error
    enabled = USE_COMPILED
    if enabled is None:
        enabled = os.environ.get("DYNTC_FRECHET_FAST", "1").strip().lower() not in ("0", "false", "no", "off")
    if not enabled or x.device.type != "cpu" or x.shape[-2] > COMPILED_MAX_POINTS:
        return None
    if _compiled_error is None:
        try:
            return importlib.import_module("dyntc.core.geometry._lorentz_kernels")
        except Exception as exc:  # ImportError, or numba failing to initialise
            _compiled_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"dyntc frechet_mean: using the PyTorch solver because numba is unavailable "
                          f"({_compiled_error})", RuntimeWarning, stacklevel=3)  # fmt: skip
    return None


def _solve_compiled(kernels, x: torch.Tensor, w: torch.Tensor, max_iter: int, tol: float):
    """:func:`_solve` by the numba kernel (same iteration, set by set); same return values."""
    out = kernels.solve(x.contiguous().numpy(), w.contiguous().numpy(), max_iter, tol)
    st = {k: torch.from_numpy(out[k]) for k in ("p", "b", "g", "sq", "r", "F", "gnorm")}
    iterations = int(out["iters"].max()) if len(out["iters"]) else 0
    return st, torch.from_numpy(out["G"]), iterations, torch.from_numpy(out["stalled"])


def frechet_mean(
    points: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    max_iter: int = 100,
    tol: float = 1e-10,
    return_info: bool = False,
    differentiable: bool = False,
):
    r"""Fréchet (Karcher) mean: ``argmin_{p in H} F(p)``, ``F(p) = sum_i ŵ_i d(p, x_i)²``.

    points ``(..., n, d+1)`` on the hyperboloid -> ``(..., d+1)``; every leading index is an
    independent set (e.g. ``(150 classes, 20 support points, 129)`` for 128-dim embeddings). On CPU the solver runs as a
    numba kernel, set by set (``_lorentz_kernels``; ~4 ms for 150 x 20 x 128 dims); elsewhere, or with
    ``USE_COMPILED = False`` / ``$DYNTC_FRECHET_FAST=0``, all sets are solved together with batched
    tensor ops (Python loops only over iterations and step halvings). Both run the same iteration.
    ``weights (..., n)``: non-negative, not all zero per set, normalised to ``ŵ = w / sum w``;
    zero weights mask padded points, so sets of different sizes can be batched.

    Algorithm (computed in float64, result cast back to the input dtype):

    * Start at the closed-form ``p̃ = x̄ / sqrt(B(x̄, x̄))`` (paper eq. 8).
    * Direction: the exact Riemannian Newton direction ``v = H⁻¹ r`` with
      ``r = sum_i ŵ_i log_p(x_i) = -grad F / 2`` and ``H = Hess(F / 2)``, which in curvature -1 is
      ``sum_i ŵ_i (ζ_i I - (ζ_i - 1) u_i u_iᵀ)``, ``ζ = d coth d``, ``u_i`` the unit vector towards
      ``x_i``. ``H ⪰ I`` (``F`` is 2-strongly geodesically convex on a Hadamard manifold), so ``v``
      is a descent direction: ``<grad F, v> = -2 <r, H⁻¹ r> < 0``. Solved via Woodbury in an
      ``n × n`` system per set, or in ambient coordinates when ``n > d + 1``.
    * Step: backtracking along the geodesic ``γ(s) = exp_p(s v)`` from ``s = 1`` (halving, per
      set), with ``φ(s) = F(γ(s))``. A step is accepted if (a) the Armijo condition
      ``φ(s) <= φ(0) + 1e-4 s φ'(0)`` holds, or (b) ``φ'(s) <= s |v|² / 2``, where
      ``φ'(s) = <grad F(γ(s)), γ'(s)>`` is computed from the log maps at the candidate. Both prove
      a strict decrease of ``F``. (a) by definition. (b) because ``F`` is 2-strongly geodesically
      convex (on a Hadamard manifold ``Hess d(·, x)² ⪰ 2 I``, and ``sum ŵ_i = 1``), so
      ``φ'' >= 2 |v|²`` and for ``τ <= s``: ``φ'(τ) <= φ'(s) - 2 |v|² (s - τ)``; integrating,
      ``φ(s) - φ(0) <= s φ'(s) - s² |v|² <= -s² |v|² / 2 < 0``. Test (b) needs only first-order
      quantities, so it stays reliable where the decrease of ``F`` is below ``F``'s rounding error
      (there (a) is a coin flip). It holds at least up to the line minimum, so few halvings are
      ever needed, and it accepts the full Newton step near the optimum: convergence is quadratic
      (typically 2-5 iterations from ``p̃`` to ``|grad F| < 1e-10``). A unit-step Karcher flow
      ``p <- exp_p(r)`` is instead a fixed gradient step of size 1/2, which diverges once
      ``H``'s largest eigenvalue (~ mean of ``d coth d``) exceeds 2, i.e. for spread sets.
    * A set stops when ``|grad F| < tol`` (``|·|`` the Riemannian norm) or when no step in 40
      halvings decreases ``F`` (floating-point limit, e.g. points ~30 away from the origin).

    Gradients: with ``differentiable=False`` (default; the paper detaches prototypes) the result
    does not require grad. With ``differentiable=True`` the solver runs detached and is followed
    by one Newton step ``p* -> exp_{p*}(H⁻¹ r)`` taken *with* autograd from the detached optimum:
    its value equals ``p*`` up to ``O(|grad F|²)`` and, because ``r(p*) = 0``, its Jacobian is
    exactly the implicit-function-theorem Jacobian ``dp*/dx = H⁻¹ ∂r/∂x`` (w.r.t. points and
    positive weights). Second derivatives through it are not exact.

    return_info=True returns ``(mean, info)``, ``info = {"iterations": int, "grad_norm": (...),
    "converged": (...) bool}`` (``grad_norm`` is ``|grad F|`` at the solver's final point).
    """
    if points.dim() < 2:
        raise DyntcError(f"points must be (..., n, d+1), got shape {tuple(points.shape)}")
    if not (is_int(max_iter) and max_iter >= 0):
        raise DyntcError(f"max_iter must be an integer >= 0, got {max_iter!r}")
    if not (is_number(tol) and tol >= 0):
        raise DyntcError(f"tol must be a number >= 0, got {tol!r}")
    batch, (n, D) = points.shape[:-2], points.shape[-2:]
    dtype = points.dtype
    w_in = _normalised_weights(weights, points)
    x = points.to(torch.float64).reshape(-1, n, D)
    w = w_in.to(torch.float64).reshape(-1, n)
    with torch.no_grad():
        xd, wd = x.detach(), w.detach()
        padded = weights is not None and bool((wd == 0).any())
        if padded:  # padded points may be anything: keep them out of the arithmetic
            p0 = normalized_euclidean_mean(xd, wd)
            xd = torch.where((wd > 0).unsqueeze(-1), xd, p0.unsqueeze(-2))
        kernels = _compiled_solver(xd)
        if kernels is not None:
            st, G, iterations, stalled = _solve_compiled(kernels, xd, wd, int(max_iter), float(tol))
        else:
            st, G, iterations, stalled = _solve(xd, wd, max_iter, tol)
        p = st["p"]
    if differentiable and torch.is_grad_enabled():
        # one Newton step from the detached optimum: the gradient of r (with autograd) through a
        # fixed H⁻¹ (the implicit-function-theorem Jacobian, see docstring)
        if padded:
            x = torch.where((wd > 0).unsqueeze(-1), x, p.unsqueeze(-2))
        b = (x @ _flip(p).unsqueeze(-1)).squeeze(-1)
        r = _combine(x, p, w * _d_over_sinh((b - 1.0).clamp_min(0.0)), b)
        with torch.no_grad():
            st_fixed = {k: val.detach() for k, val in st.items()}
        v, _ = _newton_direction(st_fixed, xd, G, wd, r=r)
        p = exp_map(p, v)
    mean = p.to(dtype).reshape(*batch, D)
    if not return_info:
        return mean
    info = {
        "iterations": iterations,
        "grad_norm": st["gnorm"].reshape(batch),
        "converged": ((st["gnorm"] < tol) & ~stalled).reshape(batch),
    }
    return mean, info


def paper_mean(
    points: torch.Tensor, weights: torch.Tensor | None = None, lr: float = 0.01, iters: int = 100
) -> torch.Tensor:
    """The paper's prototype rule, for comparison: fixed-step Riemannian gradient descent from p̃.

    ``p <- exp_p(-lr grad φ(p))`` with ``φ(p) = sum_i w_i d(p, x_i)²`` (paper eq. 6, unnormalised;
    ``w_i = 1`` by default), ``grad φ = -2 sum_i w_i log_p(x_i)``, started at
    :func:`normalized_euclidean_mean`, ``iters`` steps of size ``lr``. The effective step is
    ``2 lr sum_i w_i`` Karcher steps, so it converges slowly for tight sets and diverges when
    ``2 lr sum_i w_i · mean(d coth d) > 2``. Runs in the input dtype with autograd; each step is
    the same batched log-map sum as :func:`frechet_mean` uses (no ``(..., n, d+1)`` temporaries).
    """
    w = torch.ones(points.shape[:-1], dtype=points.dtype, device=points.device)
    if weights is not None:
        w = _check_weights(weights, points)
    p = normalized_euclidean_mean(points, w)
    for _ in range(iters):
        # grad φ = -2 sum_i w_i log_p(x_i), log_p(x_i) = g_i (x_i - b_i p): one batched product
        b = (points @ _flip(p).unsqueeze(-1)).squeeze(-1)
        r = _combine(points, p, w * _d_over_sinh((b - 1.0).clamp_min(0.0)), b)
        p = exp_map(p, 2.0 * lr * r)
    return p
