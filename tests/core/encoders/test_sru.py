"""dyntc.core.encoders.sru against sru 2.6.0 (same weights -> same numbers), fast path vs reference path,
gradcheck of the numba Function, and the fallbacks."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch

from dyntc.core.encoders import sru as dsru
from dyntc.core.encoders.sru import SRU, from_sru


@pytest.fixture(scope="module")
def sru_lib():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import sru  # compiles its C++ CPU extension with ninja on the first import
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"sru 2.6.0 not importable here ({type(exc).__name__}: {exc})")
    return sru


def assert_near(ours: torch.Tensor, theirs: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    """max |ours - theirs| <= tol * max(1, max |theirs|) (absolute for O(1) values, relative for
    large sums such as weight gradients)."""
    assert ours.shape == theirs.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
    scale = max(1.0, theirs.abs().max().item())
    err = (ours.double() - theirs.double()).abs().max().item()
    assert err <= tol * scale, f"{what}: max abs difference {err:.3g} > {tol * scale:.3g}"


def lengths_mask(lengths: list[int], steps: int) -> torch.Tensor:
    return torch.arange(steps)[:, None] >= torch.tensor(lengths)[None, :]  # (T, B), True = padding


def run(model, x, c0, mask, go, gc, **kw):
    """Forward, then backward of a random linear functional of (output, c). Returns the outputs
    and the gradients w.r.t. input, c0 and every parameter (in state-dict order)."""
    x = x.clone().requires_grad_(True)
    c0 = None if c0 is None else c0.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sru: "Running SRU on CPU with grad_enabled=True"
        out, c = model(x, c0, mask_pad=mask, **kw)
    ((out * go).sum() + (c * gc).sum()).backward()
    grads = {"input": x.grad}
    if c0 is not None:
        grads["c0"] = c0.grad
    grads.update({name: p.grad for name, p in model.named_parameters()})
    return out.detach(), c.detach(), grads


CASES = {
    # name: (sru.SRU kwargs, input_size, use c0, use mask, fast path)
    "uni 4x128": (dict(hidden_size=128, num_layers=4), 50, False, False, True),
    "uni 4x128 mask c0": (dict(hidden_size=128, num_layers=4), 50, True, True, True),
    "highway_bias rescale k=3 first": (dict(hidden_size=32, num_layers=2, highway_bias=-2.0, rescale=True), 32, True, True, True),
    "no rescale": (dict(hidden_size=32, num_layers=3, rescale=False, highway_bias=-1.0), 20, False, True, True),
    "bidirectional ref": (dict(hidden_size=16, num_layers=3, bidirectional=True, rescale=True), 20, True, True, False),
    "bidirectional fast": (dict(hidden_size=16, num_layers=3, bidirectional=True, rescale=True), 20, True, True, True),
    "layer_norm ref": (dict(hidden_size=24, num_layers=3, layer_norm=True, rescale=True), 20, True, True, False),
    "layer_norm fast": (dict(hidden_size=24, num_layers=3, layer_norm=True, rescale=True), 20, True, True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_numbers_as_sru(sru_lib, case):
    kw, n_in, use_c0, use_mask, fast = CASES[case]
    torch.manual_seed(list(CASES).index(case))
    theirs = sru_lib.SRU(n_in, **kw)
    with torch.no_grad():  # non-trivial biases and recurrent weights
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    theirs.eval()
    ours = from_sru(theirs)
    ours.eval()
    steps, batch = 17, 5
    x = torch.randn(steps, batch, n_in)
    c0 = torch.randn(ours.num_layers, batch, ours.output_size) if use_c0 else None
    mask = lengths_mask([17, 9, 1, 13, 17], steps) if use_mask else None
    go = torch.randn(steps, batch, ours.output_size)
    if mask is not None:
        go[mask] = 0.0
    gc = torch.randn(ours.num_layers, batch, ours.output_size)

    if fast:
        assert dsru.fast_path_status(x)[0], "fast path unavailable"
    o1, c1, g1 = run(ours, x, c0, mask, go, gc, fast=fast)
    o2, c2, g2 = run(theirs, x, c0, mask, go, gc)
    assert_near(o1, o2, "output")
    assert_near(c1, c2, "c")
    assert g1.keys() == g2.keys()
    for name in g2:
        assert_near(g1[name], g2[name], f"grad {name}")
    if mask is not None:  # padding: output 0 and c carried over
        assert (o1[mask] == 0).all()

    # inference: sru's compiled C++ path (unidirectional or bidirectional) vs ours, no grad
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o3, c3 = ours(x, c0, mask_pad=mask, fast=fast)
        o4, c4 = theirs(x, c0, mask_pad=mask)
    assert_near(o3, o4, "no-grad output")
    assert_near(c3, c4, "no-grad c")


def test_training_mode_dropout_matches_sru(sru_lib):
    """Dropout masks use the random generator exactly as sru does, so training mode agrees too."""
    torch.manual_seed(0)
    theirs = sru_lib.SRU(50, 64, num_layers=3, dropout=0.4, rescale=True)
    ours = from_sru(theirs)
    ours.train()
    theirs.train()
    x = torch.randn(9, 4, 50)
    go, gc = torch.randn(9, 4, 64), torch.randn(3, 4, 64)
    torch.manual_seed(7)
    o1, c1, g1 = run(ours, x, None, None, go, gc)
    torch.manual_seed(7)
    o2, c2, g2 = run(theirs, x, None, None, go, gc)
    assert_near(o1, o2, "output")
    assert_near(c1, c2, "c")
    for name in g2:
        assert_near(g1[name], g2[name], f"grad {name}")
    torch.manual_seed(8)
    o3, _, _ = run(ours, x, None, None, go, gc)
    assert (o3 - o1).abs().max() > 1e-3, "dropout had no effect"


def test_initialisation_matches_sru(sru_lib):
    for kw in (dict(), dict(dropout=0.3, highway_bias=-1.5), dict(layer_norm=True, bidirectional=True)):
        torch.manual_seed(3)
        theirs = sru_lib.SRU(50, 32, num_layers=3, rescale=True, **kw)
        torch.manual_seed(3)
        ours = SRU(50, 32, num_layers=3, **kw)
        sd1, sd2 = ours.state_dict(), theirs.state_dict()
        assert sd1.keys() == sd2.keys()
        for key in sd1:
            assert torch.equal(sd1[key], sd2[key]), (kw, key)


def test_load_sru_state_dict(sru_lib):
    theirs = sru_lib.SRU(20, 16, num_layers=2, rescale=True)
    ours = SRU(20, 16, num_layers=2)
    ours.load_sru_state_dict(theirs.state_dict())
    assert torch.equal(ours.rnn_lst[1].weight_c, theirs.rnn_lst[1].weight_c)
    with pytest.raises(ValueError, match="shape"):
        SRU(20, 8, num_layers=2).load_sru_state_dict(theirs.state_dict())
    with pytest.raises(ValueError, match="projection_size"):
        from_sru(sru_lib.SRU(20, 16, num_layers=2, projection_size=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kw", [dict(), dict(bidirectional=True, layer_norm=True, highway_bias=-1.0, dropout=0.3)])
def test_fast_matches_reference(dtype, kw):
    torch.manual_seed(1)
    model = SRU(12, 10, num_layers=3, **kw).to(dtype)
    model.train()  # dropout on: the same masks in both paths (same seed)
    steps, batch = 11, 6
    x = torch.randn(steps, batch, 12, dtype=dtype)
    c0 = torch.randn(3, batch, model.output_size, dtype=dtype)
    mask = lengths_mask([11, 3, 7, 1, 11, 10], steps)
    go = torch.randn(steps, batch, model.output_size, dtype=dtype)
    gc = torch.randn(3, batch, model.output_size, dtype=dtype)
    torch.manual_seed(2)
    o1, c1, g1 = run(model, x, c0, mask, go, gc, fast=True)
    torch.manual_seed(2)
    o2, c2, g2 = run(model, x, c0, mask, go, gc, fast=False)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert_near(o1, o2, "output", tol)
    assert_near(c1, c2, "c", tol)
    for name in g2:
        assert_near(g1[name], g2[name], f"grad {name}", tol)


@pytest.mark.parametrize("k, dirs", [(3, 1), (4, 1), (3, 2), (4, 2)])
def test_gradcheck_fast_function(k, dirs):
    kernels = dsru._load_backend("cpu")
    assert kernels is not None, dsru._load_errors
    torch.manual_seed(k * 10 + dirs)
    L, B, H = 5, 3, 4
    d = dict(dtype=torch.float64)
    U = torch.randn(L, B, dirs, k, H, **d, requires_grad=True)
    xp = None if k == 4 else torch.randn(L, B, dirs, H, **d, requires_grad=True)
    wc = torch.randn(2 * dirs * H, **d, requires_grad=True)
    bias = torch.randn(2 * dirs * H, **d, requires_grad=True)
    c0 = torch.randn(B, dirs, H, **d, requires_grad=True)
    mask_c = (torch.rand(B, dirs * H) > 0.3).double() / 0.7
    mask_pad = lengths_mask([5, 2, 4], L)
    fn = kernels.SRUFunction.apply
    assert torch.autograd.gradcheck(lambda *a: fn(*a, mask_c, mask_pad, 1.7), (U, xp, wc, bias, c0))
    assert torch.autograd.gradcheck(lambda *a: fn(*a, None, None, 1.0), (U, xp, wc, bias, c0))


@pytest.mark.parametrize("n_in, dirs, layer_norm", [(7, 1, False), (4, 1, False), (8, 2, False), (8, 2, True), (5, 2, True)])
def test_gradcheck_fast_layer_function(n_in, dirs, layer_norm):
    """The fused GEMM + recurrence Function (k = 3 when n_in == dirs * H, else 4), float64."""
    kernels = dsru._load_backend("cpu")
    assert kernels is not None, dsru._load_errors
    torch.manual_seed(n_in + dirs)
    L, B, H = 4, 3, 4
    K = 3 if n_in == dirs * H else 4
    d = dict(dtype=torch.float64)
    x = torch.randn(L, B, n_in, **d, requires_grad=True)
    x_hw = torch.randn(L, B, n_in, **d, requires_grad=True) if layer_norm else None
    w = torch.randn(n_in, dirs * H * K, **d, requires_grad=True)
    wc = torch.randn(2 * dirs * H, **d, requires_grad=True)
    bias = torch.randn(2 * dirs * H, **d, requires_grad=True)
    c0 = torch.randn(B, dirs, H, **d, requires_grad=True)
    mask_c = (torch.rand(B, dirs * H) > 0.3).double() / 0.7
    mask_pad = lengths_mask([4, 1, 3], L)
    fn = dsru.SRULayerFunction.apply

    def f(x, w, wc, bias, c0, *hw):
        return fn(x, w, wc, bias, c0, mask_c, mask_pad, hw[0] if hw else None, 1.3, dirs, H, K, kernels)

    inputs = (x, w, wc, bias, c0) + ((x_hw,) if layer_norm else ())
    assert torch.autograd.gradcheck(f, inputs)


def test_sigmoid_kernel_accuracy():
    """The float32 kernel's own exp: compare a 1-layer forward with float64 numbers over a wide range."""
    torch.manual_seed(0)
    model = SRU(8, 8, num_layers=1)  # k = 3
    with torch.no_grad():
        model.rnn_lst[0].bias.uniform_(-100, 100)  # gates from saturated to 0.5
    x = torch.randn(3, 4, 8) * 30
    with torch.no_grad():
        o32, _ = model(x, fast=True)
        o64, _ = model.double()(x.double(), fast=False)
    assert_near(o32, o64.float(), "output", 2e-6)


def test_env_var_disables_fast_path_without_warning(monkeypatch):
    monkeypatch.setenv("DYNTC_SRU_FAST", "0")
    called = []
    monkeypatch.setattr(dsru, "_recurrence_reference", _spy(dsru._recurrence_reference, called))
    model = SRU(6, 5, num_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, c = model(torch.randn(4, 3, 6))
    assert len(called) == 2 and out.shape == (4, 3, 5) and c.shape == (2, 3, 5)
    monkeypatch.delenv("DYNTC_SRU_FAST")
    monkeypatch.setattr(dsru, "USE_FAST", False)
    model(torch.randn(4, 3, 6))
    assert len(called) == 4
    monkeypatch.setattr(dsru, "USE_FAST", None)
    model(torch.randn(4, 3, 6))
    assert len(called) == 4  # fast path again


def test_fallback_warns_when_numba_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    monkeypatch.delitem(sys.modules, "dyntc.core.encoders._sru_kernels", raising=False)
    monkeypatch.setattr(dsru, "_loaded", {})
    monkeypatch.setattr(dsru, "_load_errors", {})
    called = []
    monkeypatch.setattr(dsru, "_recurrence_reference", _spy(dsru._recurrence_reference, called))
    torch.manual_seed(0)
    model = SRU(6, 5, num_layers=2)
    x = torch.randn(4, 3, 6)
    with pytest.warns(RuntimeWarning, match="numba unavailable"):
        out, _ = model(x)
    assert len(called) == 2
    monkeypatch.undo()
    assert dsru.fast_path_status(x)[0]
    torch.testing.assert_close(model(x, fast=True)[0], out, rtol=1e-5, atol=1e-6)


def test_non_cpu_and_other_dtypes_use_reference_path():
    model = SRU(6, 5, num_layers=2, bidirectional=True)
    ok, reason = dsru.fast_path_status(torch.zeros(1, device="meta"))
    assert not ok and "meta" in reason
    meta = SRU(6, 5, num_layers=2, bidirectional=True).to("meta")  # device-agnostic reference path
    with pytest.warns(RuntimeWarning, match="meta"):
        out, c = meta(torch.zeros(4, 3, 6, device="meta"), mask_pad=torch.zeros(4, 3, dtype=torch.bool, device="meta"))
    assert out.shape == (4, 3, 10) and c.shape == (2, 3, 10) and out.device.type == "meta"
    with pytest.warns(RuntimeWarning, match="dtype"):
        out, _ = model.to(torch.bfloat16)(torch.randn(4, 3, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16


def _spy(fn, calls):
    def wrapper(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return wrapper


def test_wide_vectors_marks_the_llvm_function():
    """The kernels' 512-bit hint reaches LLVM (a silent no-op would cost the forward kernel 2x)."""
    numba = pytest.importorskip("numba")
    from dyntc.core._compiled import wide_vectors

    @numba.njit(cache=False)
    def scaled(a):
        wide_vectors()
        for i in range(a.shape[0]):
            a[i] *= 2.0

    scaled(np.ones(4))
    ir = "\n".join(scaled.inspect_llvm().values())
    assert '"prefer-vector-width"="512"' in ir


def test_cached_gate_major_weight_follows_weight_changes():
    """The layer caches its reordered weight for the kernels' GEMM; every way a weight can change
    (in place as an optimizer does, load_state_dict, replacement, dtype) must be seen."""
    torch.manual_seed(0)
    model = SRU(6, 5, num_layers=2).eval()
    x = torch.randn(4, 3, 6)

    def check():
        inputs = x.to(model.rnn_lst[0].weight.dtype)
        with torch.no_grad():
            fast, ref = model(inputs, fast=True)[0], model(inputs, fast=False)[0]
        assert torch.allclose(fast, ref, atol=1e-6), (fast - ref).abs().max()

    check()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(x)[0].sum().backward()
    optimizer.step()  # in place
    model.eval()
    check()
    other = SRU(6, 5, num_layers=2)
    model.load_state_dict(other.state_dict())
    check()
    model.rnn_lst[1].weight = torch.nn.Parameter(torch.randn_like(model.rnn_lst[1].weight))  # replaced
    check()
    model.double()
    check()
    with torch.no_grad():
        model.rnn_lst[0].weight.mul_(0.5)
    with torch.inference_mode():  # first use of the new weight for inference, then training with it
        model(x.double())
    model.train()
    model(x.double())[0].sum().backward()
