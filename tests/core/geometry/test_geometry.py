"""Tests for dyntc.core.geometry: Euclidean helpers and the hyperboloid (Lorentz) model."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntc.errors import DyntcError
from dyntc.core.geometry import euclidean, lorentz

F64 = torch.float64


def rand_points(*shape, scale=1.0, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return lorentz.project(torch.randn(*shape, generator=g, dtype=F64).mul(scale).to(dtype))


def objective(p, x, w=None):
    """sum_i ŵ_i d(p, x_i)² with normalised weights (independent of the solver's internals)."""
    d2 = lorentz.sq_distance(p.unsqueeze(-2), x)
    w = torch.full_like(d2, 1.0 / x.shape[-2]) if w is None else w / w.sum(-1, keepdim=True)
    return (w * d2).sum(-1)


def riemannian_grad_norm(p, x, w=None):
    """|grad F| = 2 |sum_i ŵ_i log_p(x_i)| via the public log map."""
    logs = lorentz.log_map(p.unsqueeze(-2), x)
    w = torch.full(logs.shape[:-1], 1.0 / x.shape[-2], dtype=logs.dtype) if w is None else w / w.sum(-1, keepdim=True)
    r = (w.unsqueeze(-1) * logs).sum(-2)
    return 2.0 * (-lorentz.inner(r, r)).clamp_min(0).sqrt()


def points_at_distance(dist, dtype):
    """Point pairs on the hyperboloid at distances ``dist`` (list), plus a far-apart symmetric pair."""
    rows = []
    for d in dist:
        rows.append([0.0, 0.0, 0.0])
        rows.append([math.sinh(d), 0.0, 0.0])
    rows.append([math.sinh(15.0), 0.0, 0.0])
    rows.append([-math.sinh(15.0), 0.0, 0.0])  # distance 30 with both points far from the origin
    return torch.tensor(rows, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Euclidean
# --------------------------------------------------------------------------------------------


def test_euclidean_sq_distance_matrix_matches_cdist():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 7, 5, generator=g, dtype=F64)
    b = torch.randn(2, 4, 5, generator=g, dtype=F64)
    torch.testing.assert_close(euclidean.sq_distance_matrix(a, b), torch.cdist(a, b) ** 2)
    assert (euclidean.sq_distance_matrix(a, a).diagonal(dim1=-2, dim2=-1) < 1e-12).all()


def test_euclidean_sq_distance_gradient_finite_at_coincident_rows():
    a = torch.randn(5, 8, dtype=torch.float32).mul(100).requires_grad_()
    d = euclidean.sq_distance_matrix(a, a)
    d.sum().backward()
    assert torch.isfinite(d).all() and torch.isfinite(a.grad).all() and (d >= 0).all()


def test_euclidean_mean_and_weights():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 4, generator=g, dtype=F64)
    torch.testing.assert_close(euclidean.mean(x), x.mean(1))
    w = torch.tensor([[1.0, 1, 0, 0, 0, 0], [2, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=F64)
    m = euclidean.mean(x, w)
    torch.testing.assert_close(m[0], x[0, :2].mean(0))
    torch.testing.assert_close(m[1], (2 * x[1, 0] + x[1, 5]) / 3)
    torch.testing.assert_close(m[2], x[2].mean(0))
    for bad in (torch.zeros(3, 6), -torch.ones(3, 6)):
        with pytest.raises(ValueError, match="weights"):
            euclidean.mean(x, bad)


# --------------------------------------------------------------------------------------------
# Lorentz basics
# --------------------------------------------------------------------------------------------


def test_paper_appendix_two_differing_means():
    a = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    b = torch.tensor([math.sqrt(2.0), 1.0, 0.0], dtype=F64)
    X = torch.stack([a, a, b])
    p_star = lorentz.frechet_mean(X)
    p_tilde = lorentz.normalized_euclidean_mean(X)
    assert abs(lorentz.distance(a, p_star).item() - 0.2938) < 1e-4
    assert abs(lorentz.distance(a, p_star).item() - math.acosh(math.sqrt(2.0)) / 3) < 1e-10
    assert abs(lorentz.distance(a, p_tilde).item() - 0.3017) < 1e-4
    expected_tilde = torch.tensor([2 + math.sqrt(2), 1.0, 0.0], dtype=F64) / math.sqrt(5 + 4 * math.sqrt(2))
    torch.testing.assert_close(p_tilde, expected_tilde)
    # the Fréchet mean lies on the geodesic from a to b: d(a, p) + d(p, b) = d(a, b)
    assert abs(lorentz.distance(a, p_star) + lorentz.distance(p_star, b) - lorentz.distance(a, b)).item() < 1e-10


def test_series_branches_match_closed_forms():
    t = torch.tensor([1e-9, 1e-5, 0.999e-3, 1.001e-3, 0.1, 3.0, 1e6], dtype=F64)
    d = torch.log1p(t + torch.sqrt(t * (t + 2)))  # arccosh(1 + t), accurate for small t
    torch.testing.assert_close(lorentz._acosh1p_sq(t), d**2, rtol=1e-14, atol=0)
    torch.testing.assert_close(lorentz._d_over_sinh(t), d / torch.sinh(d), rtol=1e-14, atol=0)
    s = torch.tensor([1e-9, 0.999e-4, 1.001e-4, 0.5, 100.0], dtype=F64)
    ds = s.sqrt()
    torch.testing.assert_close(lorentz._kappa(s), (ds / torch.tanh(ds) - 1) / s, rtol=1e-7, atol=0)


def test_project_lies_on_hyperboloid():
    x = rand_points(50, 6, scale=3.0)
    torch.testing.assert_close(lorentz.inner(x, x), torch.ones(50, dtype=F64))
    assert (x[:, 0] > 0).all()


def test_distance_axioms():
    x, y, z = rand_points(3, 200, 5, scale=2.0, seed=3)
    dxy, dyx = lorentz.distance(x, y), lorentz.distance(y, x)
    assert lorentz.distance(x, x).abs().max() < 1e-6
    assert (lorentz.distance(x, x) == 0).all()
    torch.testing.assert_close(dxy, dyx, rtol=1e-12, atol=1e-12)
    assert (dxy > 0).all()
    assert (lorentz.distance(x, z) <= dxy + lorentz.distance(y, z) + 1e-9).all()
    torch.testing.assert_close(lorentz.sq_distance(x, y), dxy**2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=9, max_size=9))
def test_triangle_inequality_hypothesis(coords):
    h = torch.tensor(coords, dtype=F64).view(3, 3)
    x, y, z = lorentz.project(h)
    dxz, dxy, dyz = lorentz.distance(x, z), lorentz.distance(x, y), lorentz.distance(y, z)
    assert dxz <= dxy + dyz + 1e-7 * (1 + dxz)


def test_agreement_with_independent_numpy_formula():
    g = np.random.default_rng(0)
    hx, hy = g.normal(size=(40, 7)), g.normal(size=(30, 7)) * 1.5
    nx = np.concatenate([np.sqrt(1 + (hx**2).sum(1, keepdims=True)), hx], 1)
    ny = np.concatenate([np.sqrt(1 + (hy**2).sum(1, keepdims=True)), hy], 1)
    B = nx[:, :1] * ny[:, :1].T - nx[:, 1:] @ ny[:, 1:].T
    ref = np.arccosh(B)
    x, y = torch.from_numpy(nx), torch.from_numpy(ny)
    np.testing.assert_allclose(lorentz.project(torch.from_numpy(hx)).numpy(), nx, rtol=1e-14)
    np.testing.assert_allclose(lorentz.inner(x[:, None], y[None]).numpy(), B, rtol=1e-12)
    np.testing.assert_allclose(lorentz.distance(x[:, None], y[None]).numpy(), ref, atol=1e-6)
    np.testing.assert_allclose(lorentz.sq_distance(x[:, None], y[None]).numpy(), ref**2, atol=1e-6)
    np.testing.assert_allclose(lorentz.sq_distance_matrix(x, y).numpy(), ref**2, atol=1e-6)
    # log map: d / sinh(d) (y - B x), exp map: cosh|v| x + sinh|v| v / |v|
    ref_log = (ref / np.sinh(ref))[..., None] * (ny[None] - B[..., None] * nx[:, None])
    log = lorentz.log_map(x[:, None], y[None])
    np.testing.assert_allclose(log.numpy(), ref_log, atol=1e-6)
    v = log.numpy()
    vn = np.sqrt(np.maximum(-(v[..., 0] ** 2) + (v[..., 1:] ** 2).sum(-1), 0))[..., None]
    ref_exp = np.cosh(vn) * nx[:, None] + np.sinh(vn) / vn * v
    np.testing.assert_allclose(lorentz.exp_map(x[:, None], log).numpy(), ref_exp, atol=1e-6)
    np.testing.assert_allclose(ref_exp, np.broadcast_to(ny[None], ref_exp.shape), atol=1e-6)


def test_exp_log_round_trip_and_tangency():
    x = rand_points(100, 6, scale=2.0, seed=4)
    y = rand_points(100, 6, scale=2.0, seed=5)
    v = lorentz.log_map(x, y)
    assert lorentz.inner(x, v).abs().max() < 1e-9  # tangent at x
    torch.testing.assert_close((-lorentz.inner(v, v)).sqrt(), lorentz.distance(x, y))  # |log| = d
    torch.testing.assert_close(lorentz.exp_map(x, v), y)
    torch.testing.assert_close(lorentz.log_map(x, x), torch.zeros_like(x))
    torch.testing.assert_close(lorentz.exp_map(x, torch.zeros_like(x)), x)
    # log(exp(v)) = v for tangent v
    u = lorentz.tangent_project(x, torch.randn(100, 7, dtype=F64))
    torch.testing.assert_close(lorentz.log_map(x, lorentz.exp_map(x, u)), u)


def test_tangent_project():
    x = rand_points(20, 4, scale=2.0)
    u = torch.randn(20, 5, dtype=F64) * 3
    v = lorentz.tangent_project(x, u)
    assert lorentz.inner(x, v).abs().max() < 1e-10
    torch.testing.assert_close(lorentz.tangent_project(x, v), v)  # idempotent


def test_poincare_round_trip():
    x = rand_points(30, 4, scale=2.0, seed=6)
    p = lorentz.to_poincare(x)
    assert (p.norm(dim=-1) < 1).all()
    torch.testing.assert_close(lorentz.from_poincare(p), x)
    # Poincaré distance arccosh(1 + 2|p-q|² / ((1-|p|²)(1-|q|²))) agrees
    q = lorentz.to_poincare(rand_points(30, 4, scale=2.0, seed=7))
    dp = torch.acosh(1 + 2 * (p - q).square().sum(-1) / ((1 - p.square().sum(-1)) * (1 - q.square().sum(-1))))
    torch.testing.assert_close(lorentz.distance(lorentz.from_poincare(p), lorentz.from_poincare(q)), dp)


# --------------------------------------------------------------------------------------------
# Numerical safety
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_nan_identical_and_far_points(dtype):
    dists = [0.0, 1e-4, 1.0, 10.0, 20.0, 30.0]
    h = points_at_distance(dists, dtype).requires_grad_()
    for fn in ("distance", "sq_distance", "sq_distance_matrix"):
        h.grad = None
        x = lorentz.project(h)
        if fn == "sq_distance_matrix":
            out = lorentz.sq_distance_matrix(x, x)
            pairs = out[torch.arange(0, 2 * len(dists), 2), torch.arange(1, 2 * len(dists), 2)].sqrt()
            diag = out.diagonal()
        else:
            out = getattr(lorentz, fn)(x.unsqueeze(-2), x.unsqueeze(-3))
            pairs = out[torch.arange(0, 2 * len(dists), 2), torch.arange(1, 2 * len(dists), 2)]
            pairs = pairs if fn == "distance" else pairs.sqrt()
            diag = out.diagonal()
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(h.grad).all(), fn
        assert diag.abs().max() < 1e-6 or fn == "sq_distance_matrix", fn  # identical points
        rtol = 1e-2 if dtype == torch.float32 else 1e-6
        torch.testing.assert_close(pairs[2:].double(), torch.tensor(dists[2:], dtype=F64), rtol=rtol, atol=1e-3)
    assert lorentz.distance(x, x).eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sq_distance_gradient_at_coincident_points(dtype):
    h = torch.randn(6, 4, dtype=dtype).requires_grad_()
    x = lorentz.project(h)
    d2 = lorentz.sq_distance_matrix(x, x.detach())
    (g,) = torch.autograd.grad(d2.diagonal().sum(), h)
    assert torch.isfinite(g).all() and g.abs().max() < 1e-2  # grad of d² at its minimum is ~0
    # derivative of arccosh(b)² at b = 1+ is 2
    b = torch.tensor([1.0, 1.0 + 1e-9, 1.0 + 1e-2], dtype=F64, requires_grad=True)
    (gb,) = torch.autograd.grad(lorentz._acosh1p_sq(b - 1).sum(), b)
    torch.testing.assert_close(gb[:2], torch.tensor([2.0, 2.0], dtype=F64))
    torch.testing.assert_close(gb[2], 2 * torch.acosh(b[2]).detach() / (b[2].detach() ** 2 - 1).sqrt())


@pytest.fixture(params=["compiled", "torch"])
def solver(request, monkeypatch):
    """Run a Fréchet-mean test with the numba solver (the CPU default) and with the batched PyTorch one."""
    monkeypatch.setattr(lorentz, "USE_COMPILED", request.param == "compiled")
    if request.param == "compiled":  # else these tests would quietly run the PyTorch solver twice
        assert lorentz._compiled_solver(torch.zeros(1, 2, 3, dtype=F64)) is not None, lorentz._compiled_error
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_frechet_mean_no_nan_far_and_identical(dtype, solver):
    d = torch.zeros(4, 6, 3, dtype=dtype)
    d[0, :3, 0], d[0, 3:, 0] = math.sinh(15.0), -math.sinh(15.0)  # two clusters 30 apart
    d[1, 0, 1] = math.sinh(30.0)  # one point at distance 30, five at the origin
    d[2] = torch.randn(6, 3, dtype=dtype) * 1e5
    d[3] = 1.5  # six identical points
    h = d.clone().requires_grad_()
    m, info = lorentz.frechet_mean(lorentz.project(h), return_info=True, differentiable=True)
    assert m.dtype == dtype and torch.isfinite(m).all()
    m.sum().backward()
    assert torch.isfinite(h.grad).all()
    m = m.detach().double()
    assert lorentz.distance(m[0], lorentz.project(torch.zeros(3, dtype=F64))) < 1e-3
    assert abs(lorentz.distance(m[1], lorentz.project(torch.zeros(3, dtype=F64))).item() - 5.0) < 1e-3
    torch.testing.assert_close(m[3], lorentz.project(d[3, 0].double()), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


def test_gradcheck_sq_distance_matrix_both_args():
    x = rand_points(4, 3, seed=8).requires_grad_()
    p = rand_points(3, 3, seed=9).requires_grad_()
    assert torch.autograd.gradcheck(lorentz.sq_distance_matrix, (x, p))
    assert torch.autograd.gradgradcheck(lorentz.sq_distance_matrix, (x, p))
    # through the projection, including coincident points (series branch, t = 0)
    h = torch.randn(4, 3, dtype=F64, requires_grad=True)
    hp = torch.cat([h[:2].detach(), torch.randn(2, 3, dtype=F64)]).requires_grad_()
    fn = lambda a, b: lorentz.sq_distance_matrix(lorentz.project(a), lorentz.project(b))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, hp))


def test_gradcheck_exp_log_maps():
    x = rand_points(3, 4, seed=10).requires_grad_()
    y = rand_points(3, 4, seed=11).requires_grad_()
    v = lorentz.tangent_project(x.detach(), torch.randn(3, 5, dtype=F64)).requires_grad_()
    small = (1e-3 * v.detach()).requires_grad_()
    assert torch.autograd.gradcheck(lorentz.exp_map, (x, v))
    assert torch.autograd.gradcheck(lorentz.exp_map, (x, small))
    assert torch.autograd.gradcheck(lorentz.log_map, (x, y))
    assert torch.autograd.gradcheck(lorentz.distance, (x, y))


def test_gradcheck_frechet_mean_differentiable(solver):
    h = torch.randn(2, 5, 3, dtype=F64).mul(1.5).requires_grad_()
    w = torch.tensor([[1.0, 2.0, 0.5, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0]], dtype=F64, requires_grad=True)
    fn = lambda a, b: lorentz.frechet_mean(lorentz.project(a), b, differentiable=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, w))
    # the default is detached; the differentiable variant has the same value
    m = lorentz.frechet_mean(lorentz.project(h), w)
    assert not m.requires_grad
    md = lorentz.frechet_mean(lorentz.project(h), w, differentiable=True)
    assert md.requires_grad
    torch.testing.assert_close(md.detach(), m, rtol=1e-9, atol=1e-9)  # one more Newton step


# --------------------------------------------------------------------------------------------
# Fréchet mean
# --------------------------------------------------------------------------------------------


def spread_batch():
    """Classes of very different spreads, batched: tight, moderate, spread and very spread."""
    scales = torch.tensor([0.01, 0.3, 1.0, 3.0, 10.0, 100.0], dtype=F64).view(-1, 1, 1)
    g = torch.Generator().manual_seed(12)
    return lorentz.project(torch.randn(6, 20, 16, generator=g, dtype=F64) * scales)


def test_frechet_mean_gradient_norm_batched(solver):
    x = spread_batch()
    m, info = lorentz.frechet_mean(x, return_info=True)
    assert m.shape == (6, 17)
    gn = riemannian_grad_norm(m, x)
    assert (gn < 1e-6).all(), gn
    assert info["converged"].all() and (info["grad_norm"] < 1e-6).all()
    assert isinstance(info["iterations"], int) and 1 <= info["iterations"] < 20
    # it is the minimiser: better than p̃, than the paper's rule, and than nearby points
    F = objective(m, x)
    assert (F <= objective(lorentz.normalized_euclidean_mean(x), x) + 1e-12).all()
    u = lorentz.tangent_project(m, 1e-3 * torch.randn_like(m))
    assert (F < objective(lorentz.exp_map(m, u), x)).all()
    # each class solved alone gives the same result
    torch.testing.assert_close(lorentz.frechet_mean(x[3]), m[3])


def test_unit_step_karcher_flow_diverges_where_frechet_mean_converges(solver):
    g = torch.Generator().manual_seed(13)
    x = lorentz.project(torch.randn(20, 8, generator=g, dtype=F64) * 3.0)  # ~3 from the mean
    p = lorentz.normalized_euclidean_mean(x)
    F0 = objective(p, x)
    values = []
    for _ in range(10):  # p <- exp_p(mean_i log_p(x_i)), the unit-step Karcher flow
        p = lorentz.exp_map(p, lorentz.log_map(p.unsqueeze(-2), x).mean(-2))
        values.append(objective(p, x).item())
    assert values[0] > F0 and values[-1] > values[0]  # the objective increases
    m = lorentz.frechet_mean(x)
    assert objective(m, x) < F0 and riemannian_grad_norm(m, x) < 1e-6


def test_frechet_mean_zero_weights_equal_subset_and_batching(solver):
    x = spread_batch()[:4, :10]
    w = torch.ones(4, 10, dtype=F64)
    w[0, 6:] = 0
    w[1, 1:] = 0  # a single point: the mean is that point
    w[2, ::2] = 0
    x = x.clone()
    x[0, 6:] = 1e30  # padded garbage must not matter
    m = lorentz.frechet_mean(x, w)
    torch.testing.assert_close(m[0], lorentz.frechet_mean(x[0, :6]))
    torch.testing.assert_close(m[1], x[1, 0])
    torch.testing.assert_close(m[2], lorentz.frechet_mean(x[2, 1::2]))
    torch.testing.assert_close(m[3], lorentz.frechet_mean(x[3]))
    # integer weights = repeated points
    w2 = torch.tensor([3.0, 1.0, 2.0], dtype=F64)
    rep = torch.cat([x[3, :1].expand(3, -1), x[3, 1:2], x[3, 2:3].expand(2, -1)])
    torch.testing.assert_close(lorentz.frechet_mean(x[3, :3], w2), lorentz.frechet_mean(rep))
    # leading batch dims and float32 in -> float32 out
    xb = x[3:].expand(2, 3, 10, 17)
    assert lorentz.frechet_mean(xb).shape == (2, 3, 17)
    m32 = lorentz.frechet_mean(x[3].float())
    assert m32.dtype == torch.float32
    torch.testing.assert_close(m32.double(), m[3], rtol=1e-5, atol=1e-5)


def test_frechet_mean_bad_weights():
    x = rand_points(2, 4, 3)
    for bad in (torch.zeros(2, 4), torch.tensor([[1.0, -1.0, 1.0, 1.0], [1, 1, 1, 1]]), torch.ones(2, 4) * float("nan")):
        with pytest.raises(ValueError, match="weights"):
            lorentz.frechet_mean(x, bad)
    with pytest.raises(ValueError, match="weights"):
        lorentz.frechet_mean(x, torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="weights"):
        lorentz.frechet_mean(x, torch.ones(2, 5))


def test_paper_mean_matches_for_tight_sets(solver):
    x = rand_points(5, 20, 8, scale=0.3, seed=14)
    torch.testing.assert_close(lorentz.paper_mean(x), lorentz.frechet_mean(x), rtol=1e-8, atol=1e-8)


def test_compiled_solver_is_the_cpu_default_and_matches_the_torch_solver(monkeypatch):
    x = spread_batch()
    w = torch.rand(6, 20, dtype=F64, generator=torch.Generator().manual_seed(15))
    w[:, 15:] = 0  # padded points
    monkeypatch.setattr(lorentz, "USE_COMPILED", None)
    monkeypatch.delenv("DYNTC_FRECHET_FAST", raising=False)
    monkeypatch.setattr(lorentz, "_solve", lambda *a: pytest.fail("PyTorch solver used on CPU"))
    m_fast, info_fast = lorentz.frechet_mean(x, w, return_info=True)
    monkeypatch.undo()
    monkeypatch.setattr(lorentz, "USE_COMPILED", False)
    m_torch, info_torch = lorentz.frechet_mean(x, w, return_info=True)
    assert lorentz.distance(m_fast, m_torch).max() < 1e-10
    assert info_fast["iterations"] == info_torch["iterations"]
    assert info_fast["converged"].all() and info_torch["converged"].all()
    torch.testing.assert_close(info_fast["grad_norm"], info_torch["grad_norm"], rtol=0, atol=1e-10)
    monkeypatch.setenv("DYNTC_FRECHET_FAST", "0")
    monkeypatch.setattr(lorentz, "USE_COMPILED", None)
    assert lorentz._compiled_solver(x) is None
    # large sets (an n x n Newton system each) go to the PyTorch solver, whose Cholesky is LAPACK's
    monkeypatch.setattr(lorentz, "USE_COMPILED", True)
    big = lorentz.project(torch.randn(2, lorentz.COMPILED_MAX_POINTS + 1, 4, dtype=F64))
    assert lorentz._compiled_solver(x) is not None and lorentz._compiled_solver(big) is None
    # max_iter=0 returns p̃ from both
    p0 = lorentz.normalized_euclidean_mean(x, w)
    for flag in (True, False):
        monkeypatch.setattr(lorentz, "USE_COMPILED", flag)
        torch.testing.assert_close(lorentz.frechet_mean(x, w, max_iter=0), p0, rtol=1e-12, atol=1e-12)


def test_frechet_mean_bad_arguments_and_missing_numba(monkeypatch):
    x = rand_points(2, 5, 3, scale=0.3, seed=3)
    for kwargs, match in [({"max_iter": None}, "max_iter must be an integer"), ({"max_iter": 2.5}, "max_iter must"),
                          ({"tol": None}, "tol must be a number"), ({"tol": -1.0}, "tol must be")]:  # fmt: skip
        with pytest.raises(DyntcError, match=match):
            lorentz.frechet_mean(x, **kwargs)
    with pytest.raises(DyntcError, match="floating-point"):  # 1/n weights would round to 0
        lorentz.frechet_mean(torch.tensor([[[1, 0, 0], [1, 0, 0]]]))
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    monkeypatch.delitem(sys.modules, "dyntc.core.geometry._lorentz_kernels", raising=False)
    monkeypatch.setattr(lorentz, "_compiled_error", None)
    monkeypatch.setattr(lorentz, "USE_COMPILED", None)
    with pytest.warns(RuntimeWarning, match="numba is unavailable"):
        m = lorentz.frechet_mean(x)
    monkeypatch.undo()
    torch.testing.assert_close(m, lorentz.frechet_mean(x), rtol=1e-10, atol=1e-10)


def test_newton_direction_solves_the_hessian_system_in_both_forms():
    """v = H⁻¹ r, checked against an explicit Hessian-vector product, for n <= d+1 (Woodbury, n x n)
    and n > d+1 (tangent-space form, (d+1) x (d+1)); and large sets still converge."""
    for n, d in ((5, 8), (40, 8)):
        x = rand_points(3, n, d, scale=1.5, seed=16)
        w = torch.rand(3, n, dtype=F64, generator=torch.Generator().manual_seed(17))
        w = w / w.sum(-1, keepdim=True)
        p = lorentz.normalized_euclidean_mean(x, w)
        st = lorentz._evaluate(p, x, w)
        G = x @ lorentz._flip(x).mT
        v, slope = lorentz._newton_direction(st, x, G, w)
        torch.testing.assert_close(lorentz.inner(p, v), torch.zeros(3, dtype=F64), rtol=0, atol=1e-12)  # tangent
        l = st["g"].unsqueeze(-1) * (x - st["b"].unsqueeze(-1) * p.unsqueeze(-2))  # log_p(x_i)
        kappa = lorentz._kappa(st["sq"])
        a = (w * (1.0 + st["sq"] * kappa)).sum(-1, keepdim=True)
        l_dot_v = -(l * lorentz._flip(v).unsqueeze(-2)).sum(-1)  # <l_i, v> = -B(l_i, v)
        Hv = a * v - ((w * kappa * l_dot_v).unsqueeze(-1) * l).sum(-2)
        torch.testing.assert_close(Hv, st["r"], rtol=1e-10, atol=1e-12)
        assert (slope < 0).all()
    x = rand_points(2, 300, 6, scale=2.0, seed=18)  # beyond COMPILED_MAX_POINTS: PyTorch solver
    m, info = lorentz.frechet_mean(x, return_info=True)
    assert info["converged"].all() and (riemannian_grad_norm(m, x) < 1e-8).all()


def test_compiled_solver_over_several_thread_blocks(monkeypatch):
    """Enough sets for run_blocks to split them across threads (blocks of >= 16 sets)."""
    x = rand_points(40, 7, 5, scale=1.0, seed=21)
    monkeypatch.setattr(lorentz, "USE_COMPILED", True)
    fast = lorentz.frechet_mean(x)
    monkeypatch.setattr(lorentz, "USE_COMPILED", False)
    assert lorentz.distance(fast, lorentz.frechet_mean(x)).max() < 1e-10
