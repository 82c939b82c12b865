"""numba kernel for :func:`dyntc.core.geometry.lorentz.frechet_mean` on CPU: the same damped Riemannian
Newton iteration as ``lorentz._solve``, run set by set in compiled loops.

The batched PyTorch solver spends most of its time in tensor-op overhead (some 900 small ops per
call) and in passes over all points for every candidate step; here each set's ``(n, d+1)`` points
stay in cache for all its iterations. Float64 throughout. The arithmetic is ``lorentz._solve``'s,
step for step: start at ``p̃``; evaluate ``b_i = B(p, x_i)``, ``d_i²``, ``g_i = d_i / sinh d_i``,
``r = sum_i w_i log_p(x_i)`` (projected onto ``T_p``); Newton direction by Woodbury with an
``n × n`` Cholesky (a failed factorisation falls back to ``v = r / a``); backtracking along
``exp_p(s v)`` with the Armijo test or the strong-convexity slope test. Differences: the summation
order of dot products (vectorised: ``reassoc`` on those loops alone), and for sets with more
points than dimensions the PyTorch solver computes the same Newton direction from a (d+1)-dim
system instead; results agree with the PyTorch solver to rounding (tested). Used for sets of at
most ``lorentz.COMPILED_MAX_POINTS`` points, where the n × n system is cheap.

Sets run on ``torch.get_num_threads()`` threads (the kernel releases the GIL).

numba's on-disk cache (``cache=True``) is keyed on this file alone and freezes module globals at
compile time: after editing what it takes from ``_lorentz_series`` (series thresholds and coefficients, the step-search constants) or
``dyntc.core._compiled``, touch this file so that the kernels are recompiled.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dyntc.core._compiled import run_blocks
from dyntc.core.geometry import _lorentz_series as _lz

_T_SERIES = _lz._T_SERIES
_Q_SERIES = _lz._Q_SERIES
_ACOSH_SQ = np.array(_lz._ACOSH_SQ)
_D_OVER_SINH = np.array(_lz._D_OVER_SINH)
_KAPPA = np.array(_lz._KAPPA)
_COSH = np.array(_lz._COSH)
_SINHC = np.array(_lz._SINHC)
_ARMIJO_C1 = _lz._ARMIJO_C1
_MAX_HALVINGS = _lz._MAX_HALVINGS

_JIT = dict(cache=True, error_model="numpy")
_DOT = dict(cache=True, error_model="numpy", fastmath={"reassoc", "contract"})  # vectorised sums


@njit(**_JIT)
def _poly(coefs, x):  # pragma: no cover - numba
    out = coefs[-1]
    for k in range(coefs.shape[0] - 2, -1, -1):
        out = out * x + coefs[k]
    return out


@njit(**_JIT)
def _acosh1p(t):  # pragma: no cover - numba
    return math.log1p(t + math.sqrt(t) * math.sqrt(t + 2.0))


@njit(**_JIT)
def _acosh1p_sq(t):  # pragma: no cover - numba
    if t < _T_SERIES:
        return t * _poly(_ACOSH_SQ, t)
    a = _acosh1p(t)
    return a * a


@njit(**_JIT)
def _d_over_sinh(t):  # pragma: no cover - numba
    if t < _T_SERIES:
        return _poly(_D_OVER_SINH, t)
    return _acosh1p(t) / (math.sqrt(t) * math.sqrt(t + 2.0))


@njit(**_JIT)
def _kappa(s):  # pragma: no cover - numba
    if s < _Q_SERIES:
        return _poly(_KAPPA, s)
    d = math.sqrt(s)
    return (d / math.tanh(d) - 1.0) / s


@njit(**_DOT)
def _inner(x, y):  # pragma: no cover - numba
    """B(x, y) = x0 y0 - sum_k xk yk."""
    acc = 0.0
    for k in range(1, x.shape[0]):
        acc += x[k] * y[k]
    return x[0] * y[0] - acc


@njit(**_DOT)
def _axpy(a, x, y):  # pragma: no cover - numba
    """y += a x."""
    for k in range(x.shape[0]):
        y[k] += a * x[k]


@njit(**_DOT)
def _renormalise(p):  # pragma: no cover - numba
    """p0 = sqrt(1 + |p_spatial|²): back onto the hyperboloid."""
    acc = 0.0
    for k in range(1, p.shape[0]):
        acc += p[k] * p[k]
    p[0] = math.sqrt(1.0 + acc)


@njit(**_JIT)
def _combine(x, p, coef, b, out):  # pragma: no cover - numba
    """out = T_p-projection of sum_i coef_i (x_i - b_i p)."""
    out[:] = 0.0
    cb = 0.0
    for i in range(x.shape[0]):
        _axpy(coef[i], x[i], out)
        cb += coef[i] * b[i]
    _axpy(-cb, p, out)
    _axpy(-_inner(p, out), p, out)


@njit(**_JIT)
def _evaluate(p, x, w, b, g, sq, coef, r):  # pragma: no cover - numba
    """Fill b, g, sq, r at p (see lorentz._evaluate); returns (F, |grad F|)."""
    F = 0.0
    for i in range(x.shape[0]):
        b[i] = _inner(p, x[i])
        t = max(b[i] - 1.0, 0.0)
        sq[i] = _acosh1p_sq(t)
        g[i] = _d_over_sinh(t)
        coef[i] = w[i] * g[i]
        F += w[i] * sq[i]
    _combine(x, p, coef, b, r)
    return F, 2.0 * math.sqrt(max(-_inner(r, r), 0.0))


@njit(**_JIT)
def _cholesky_solve(A, y):  # pragma: no cover - numba
    """Solve A z = y in place (z in y) for symmetric positive-definite A (overwritten by its lower
    Cholesky factor). Returns False where the factorisation fails (a pivot not > 0)."""
    n = A.shape[0]
    for j in range(n):
        d = A[j, j]
        for k in range(j):
            d -= A[j, k] * A[j, k]
        if not d > 0.0:
            return False
        d = math.sqrt(d)
        A[j, j] = d
        for i in range(j + 1, n):
            s = A[i, j]
            for k in range(j):
                s -= A[i, k] * A[j, k]
            A[i, j] = s / d
    for i in range(n):  # L u = y
        s = y[i]
        for k in range(i):
            s -= A[i, k] * y[k]
        y[i] = s / A[i, i]
    for i in range(n - 1, -1, -1):  # Lᵀ z = u
        s = y[i]
        for k in range(i + 1, n):
            s -= A[k, i] * y[k]
        y[i] = s / A[i, i]
    return True


@njit(**_JIT)
def _newton_direction(p, x, G, w, b, g, sq, r, A, beta, coef, v):  # pragma: no cover - numba
    """v = H⁻¹ r (see lorentz._newton_direction); returns <grad F, v>."""
    n = x.shape[0]
    a = 0.0
    for i in range(n):
        kap = _kappa(sq[i])
        a += w[i] * (1.0 + sq[i] * kap)
        coef[i] = math.sqrt(w[i] * kap)  # k_i^½
        beta[i] = coef[i] * (-g[i] * _inner(x[i], r))  # k_i^½ <l_i, r>
    for i in range(n):
        for j in range(n):
            m = g[i] * g[j] * (b[i] * b[j] - G[i, j])
            A[i, j] = (a if i == j else 0.0) - coef[i] * m * coef[j]
    ok = _cholesky_solve(A, beta)
    for i in range(n):
        ok = ok and math.isfinite(beta[i])
    for i in range(n):
        coef[i] = coef[i] * beta[i] * g[i] if ok else 0.0
    _combine(x, p, coef, b, v)
    for k in range(v.shape[0]):
        v[k] = (r[k] + v[k]) / a
    return 2.0 * _inner(r, v)


@njit(**_JIT)
def _exp_map(p, v, s, out):  # pragma: no cover - numba
    """out = exp_p(s v) (see lorentz.exp_map)."""
    q = max(-_inner(v, v), 0.0) * s * s
    if q < _Q_SERIES:
        c, sh = _poly(_COSH, q), _poly(_SINHC, q)
    else:
        nrm = math.sqrt(q)
        c, sh = math.cosh(nrm), math.sinh(nrm) / nrm
    for k in range(p.shape[0]):
        out[k] = c * p[k] + sh * (s * v[k])
    _renormalise(out)


@njit(nogil=True, **_JIT)
def frechet_solve(c0, c1, x, w, max_iter, tol, G, p, b, g, sq, r, F, gnorm, iters, stalled):  # pragma: no cover - numba
    """Sets c0 <= c < c1 of x (C, n, D) with normalised weights w (C, n); fills G (C, n, n) =
    B(x_i, x_j), the final p (C, D) and its b, g, sq (C, n), r (C, D), F, gnorm (C,), and per set
    the Newton iterations taken and whether a step could not decrease F."""
    n, D = x.shape[1], x.shape[2]
    A = np.empty((n, n))
    beta = np.empty(n)
    coef = np.empty(n)
    v = np.empty(D)
    vel = np.empty(D)
    q = np.empty(D)
    bq, gq, sqq = np.empty(n), np.empty(n), np.empty(n)
    rq = np.empty(D)
    for c in range(c0, c1):
        xc, wc, pc, rc = x[c], w[c], p[c], r[c]
        for i in range(n):
            for j in range(i + 1):
                G[c, i, j] = G[c, j, i] = _inner(xc[i], xc[j])
        # p̃ = x̄ / sqrt(B(x̄, x̄)), x0 recomputed from the spatial part
        pc[:] = 0.0
        for i in range(n):
            _axpy(wc[i], xc[i], pc)
        scale = 1.0 / math.sqrt(max(_inner(pc, pc), 1.0))
        for k in range(D):
            pc[k] *= scale
        _renormalise(pc)
        F[c], gnorm[c] = _evaluate(pc, xc, wc, b[c], g[c], sq[c], coef, rc)
        iters[c] = 0
        stalled[c] = False
        while iters[c] < max_iter and gnorm[c] >= tol:
            iters[c] += 1
            slope = _newton_direction(pc, xc, G[c], wc, b[c], g[c], sq[c], rc, A, beta, coef, v)
            vnorm = math.sqrt(max(-_inner(v, v), 0.0))
            s = 1.0
            accepted = False
            for _ in range(_MAX_HALVINGS):
                _exp_map(pc, v, s, q)
                Fq, gq_norm = _evaluate(q, xc, wc, bq, gq, sqq, coef, rq)
                # slope of F along the geodesic at q: 2 B(r(q), γ'(s)), γ'(s) = |v| sinh(s|v|) p + cosh(s|v|) v
                sh, ch = vnorm * math.sinh(s * vnorm), math.cosh(s * vnorm)
                for k in range(D):
                    vel[k] = sh * pc[k] + ch * v[k]
                slope_s = 2.0 * _inner(rq, vel)
                if Fq <= F[c] + _ARMIJO_C1 * s * slope or slope_s <= 0.5 * s * vnorm * vnorm:
                    pc[:] = q
                    rc[:] = rq
                    b[c, :], g[c, :], sq[c, :] = bq, gq, sqq
                    F[c], gnorm[c] = Fq, gq_norm
                    accepted = True
                    break
                s *= 0.5
            if not accepted:  # no step decreases F in floating point
                stalled[c] = True
                break


def solve(x: np.ndarray, w: np.ndarray, max_iter: int, tol: float) -> dict[str, np.ndarray]:
    """Run :func:`frechet_solve` over all sets (threads over blocks of sets) -> its outputs by name."""
    C, n, D = x.shape
    out = {
        "G": np.empty((C, n, n)), "p": np.empty((C, D)), "b": np.empty((C, n)), "g": np.empty((C, n)),
        "sq": np.empty((C, n)), "r": np.empty((C, D)), "F": np.empty(C), "gnorm": np.empty(C),
        "iters": np.empty(C, np.int64), "stalled": np.empty(C, np.bool_),
    }  # fmt: skip
    run_blocks(
        frechet_solve, C, x, w, max_iter, tol, out["G"], out["p"], out["b"], out["g"], out["sq"], out["r"],
        out["F"], out["gnorm"], out["iters"], out["stalled"], min_rows_per_thread=16,
    )  # fmt: skip
    return out
