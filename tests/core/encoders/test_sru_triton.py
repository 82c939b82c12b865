"""The CUDA backend of the SRU fast path (Triton kernels), checked without a GPU:

* numerics: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors, through
  the same ``SRU.forward`` / ``SRULayerFunction`` as on CUDA, against the reference path;
* compilation: ``triton.compile`` builds every kernel variant to a cubin for sm_80 and sm_90;
* dispatch: what happens on CUDA when triton is missing or cannot run.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types
import warnings

import pytest
import torch

from dyntc.core.encoders import sru as dsru
from dyntc.core.encoders.sru import SRU

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'dyntc[gpu]')")


@pytest.fixture(scope="module")
def interpreted():
    """A private copy of ``dyntc.core.encoders._sru_triton`` whose kernels run in Triton's interpreter
    (decided when ``triton.jit`` decorates them, so the copy is loaded with the variable set)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.find_spec("dyntc.core.encoders._sru_triton")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mp.undo()
    assert "Interpreted" in type(module._forward_kernel).__name__
    return module


def lengths_mask(lengths: list[int], steps: int) -> torch.Tensor:
    return torch.arange(steps)[:, None] >= torch.tensor(lengths)[None, :]  # (T, B), True = padding


def forward_backward(model, x, c0, mask, go, gc, fast):
    x = x.clone().requires_grad_(True)
    c0 = c0.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out, c = model(x, c0, mask_pad=mask, fast=fast)
    ((out * go).sum() + (c * gc).sum()).backward()
    grads = {"input": x.grad, "c0": c0.grad, **{n: p.grad for n, p in model.named_parameters()}}
    return out.detach(), c.detach(), grads


MODELS = {
    "paper sizes, 50 -> 128 (2 of its 4 layers)": dict(input_size=50, hidden_size=128, num_layers=2),
    "bidirectional, layer norm, dropout": dict(input_size=12, hidden_size=10, num_layers=3, bidirectional=True,
                                               layer_norm=True, highway_bias=-1.0, dropout=0.3),  # fmt: skip
    "k = 3 first layer, no rescale": dict(input_size=20, hidden_size=20, num_layers=2, rescale=False, highway_bias=-2.0),
    "hidden not a multiple of 32": dict(input_size=7, hidden_size=45, num_layers=2, bidirectional=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(MODELS))
def test_triton_kernels_match_reference(interpreted, monkeypatch, name, dtype):
    """Outputs and all gradients of a whole SRU, Triton backend vs reference path: 1e-5 (float32),
    1e-12 (float64); padding, c0 and dropout masks included."""
    monkeypatch.setitem(dsru._loaded, "cpu", interpreted)  # route CPU tensors to the Triton backend
    torch.manual_seed(0)
    model = SRU(**MODELS[name]).to(dtype).train()
    steps, batch = 6, 4  # small: the interpreter takes ~10 ms per program and time step
    x = torch.randn(steps, batch, model.input_size, dtype=dtype)
    c0 = torch.randn(model.num_layers, batch, model.output_size, dtype=dtype)
    mask = lengths_mask([6, 2, 5, 1], steps)
    go = torch.randn(steps, batch, model.output_size, dtype=dtype)
    gc = torch.randn(model.num_layers, batch, model.output_size, dtype=dtype)
    torch.manual_seed(1)
    o1, c1, g1 = forward_backward(model, x, c0, mask, go, gc, fast=True)
    torch.manual_seed(1)
    o2, c2, g2 = forward_backward(model, x, c0, mask, go, gc, fast=False)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for what, ours, ref in [("output", o1, o2), ("c", c1, c2)] + [(f"grad {k}", g1[k], g2[k]) for k in g2]:
        err = (ours - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        assert err <= tol, f"{name}, {what}: relative difference {err:.3g} > {tol}"
    with torch.no_grad():  # the inference path (no autograd node, nothing saved)
        o3, c3 = model.eval()(x, c0, mask_pad=mask, fast=True)
        o4, c4 = model(x, c0, mask_pad=mask, fast=False)
    assert torch.allclose(o3, o4, rtol=0, atol=tol) and torch.allclose(c3, c4, rtol=0, atol=tol)


def test_triton_float16_keeps_float32_state(interpreted):
    """A float16 model: inputs read and outputs written in float16 (as the reference path gives
    them), the recurrence in float32, so the result is the float32 one rounded once (not float16
    arithmetic accumulated over the steps)."""
    torch.manual_seed(0)
    L, B, H = 30, 4, 16
    x = torch.randn(L, B, H).half()
    w = (torch.randn(H, 3 * H) * 0.3).half()  # K = 3
    wc, bias, c0 = torch.randn(2 * H).half(), torch.randn(2 * H).half(), torch.zeros(B, 1, H).half()
    args = (None, None, None, 1.0, 1, H, 3, interpreted, False)
    h16, c16, _ = dsru._layer_forward(x, w, wc, bias, c0, *args)
    h32, c32, _ = dsru._layer_forward(*(t.float() for t in (x, w, wc, bias, c0)), *args)
    assert h16.dtype == c16.dtype == torch.float16
    assert (h16.float() - h32).abs().max() <= 2e-3 * h32.abs().max()
    assert (c16.float() - c32).abs().max() <= 2e-3 * c32.abs().max()


def _signature(kernel, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    ints = {"L", "B", "D", "H"}
    return {
        a: "constexpr" if a in constexprs else "i32" if a in ints else pointers.get(a, pointers["*"])
        for a in kernel.arg_names
    }


@pytest.mark.parametrize("arch", [80, 90])
def test_triton_kernels_compile_for_cuda(arch, tmp_path, monkeypatch):
    """The kernel variants (K = 3/4, mask, padding, training or inference, one or two directions)
    for each dtype combination compile to a cubin for sm_{arch} (A100 / H100): no GPU needed, so a
    kernel that would not build is caught here."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from triton.backends.compiler import GPUTarget

    from dyntc.core.encoders import _sru_triton as tr

    target = GPUTarget("cuda", arch, 32)
    dtypes = [  # (state, U / h / gradients, the highway input x): plain, float64, a half model, autocast
        ("fp32", "fp32", "fp32"), ("fp64", "fp64", "fp64"), ("fp32", "fp16", "fp16"), ("fp32", "bf16", "bf16"),
        ("fp32", "fp16", "fp32"),
    ]  # fmt: skip
    variants = [  # (K4, mask, padding, training, D == 1): each flag both ways, for every dtype combination
        (False, False, False, True, True), (True, True, True, True, False),
        (True, False, True, False, True), (False, True, False, False, False),
    ]  # fmt: skip
    for (state, io, xin), (k4, has_mask, has_pad, train, one_direction) in itertools.product(dtypes, variants):
        for kernel in (tr._forward_kernel, tr._backward_kernel):
            const = dict(K4=k4, HAS_MASK=has_mask, HAS_PAD=has_pad, BLOCK_H=32)
            if kernel is tr._forward_kernel:
                const["TRAIN"] = train
            elif not train:
                continue
            if one_direction:  # what Triton compiles for D == 1 (the paper's setting): a constant
                const["D"] = 1
            pointers = {"*": "*" + state, "PAD": "*u8", "U": "*" + io, "H_OUT": "*" + io, "GH": "*" + io,
                        "GU": "*" + io, "X": "*" + xin, "GX": "*" + xin}  # fmt: skip
            src = triton.compiler.ASTSource(fn=kernel, signature=_signature(kernel, pointers, const), constexprs=const)
            compiled = triton.compile(src, target=target)
            assert len(compiled.asm["cubin"]) > 1000, (kernel, state, io, xin, k4, has_mask, has_pad, train)


def _fake_cuda_tensor(dtype=torch.float32):
    """What fast_path_status looks at (device type, dtype) without needing CUDA."""
    return types.SimpleNamespace(device=torch.device("cuda"), dtype=dtype)


def test_cuda_dispatch_reasons(monkeypatch):
    monkeypatch.setattr(dsru, "_loaded", {})
    monkeypatch.setattr(dsru, "_load_errors", {})
    monkeypatch.setattr(dsru, "_self_tests", {})
    ok, reason = dsru.fast_path_status(_fake_cuda_tensor(torch.int32))
    assert not ok and "torch.int32" in reason and "triton" in reason and "float16" in reason
    if not torch.cuda.is_available():  # the self-test cannot run: a clean refusal with the reason
        ok, reason = dsru.fast_path_status(_fake_cuda_tensor())
        assert not ok and reason.startswith("the Triton kernels failed their self-test on cuda") and "CUDA" in reason
    monkeypatch.setattr(dsru, "_loaded", {})
    monkeypatch.setattr(dsru, "_load_errors", {})
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "dyntc.core.encoders._sru_triton", raising=False)
    ok, reason = dsru.fast_path_status(_fake_cuda_tensor())
    assert not ok and reason.startswith("triton unavailable (ModuleNotFoundError")
    assert dsru.fast_path_status(torch.zeros(1))[0]  # the CPU backend is unaffected


def _tampered(backend, part: str):
    """`backend` with one result off by 1%: the forward's h or c, or the backward's weight_c gradient."""
    fake = types.SimpleNamespace(**vars(backend))

    def forward(*args, **kwargs):
        h, c, saved = backend.recurrence_forward(*args, **kwargs)
        return (h * 1.01, c, saved) if part == "h" else (h, c * 1.01, saved) if part == "c" else (h, c, saved)

    def backward(*args, **kwargs):
        gU, gx, gwc, gbias, gc0 = backend.recurrence_backward(*args, **kwargs)
        return gU, gx, gwc * 1.01, gbias, gc0

    fake.recurrence_forward = forward
    if part == "grad weight_c":
        fake.recurrence_backward = backward
    return fake


@pytest.mark.parametrize("part", ["h", "c", "grad weight_c"])
def test_self_test_rejects_wrong_kernels(interpreted, part):
    """The self-test passes the real kernels (also when first used under inference_mode) and
    refuses a backend with any one output or gradient wrong."""
    dsru._self_test(interpreted, torch.device("cpu"))
    with torch.inference_mode():
        dsru._self_test(interpreted, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="self-test"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dsru._self_test(_tampered(interpreted, part), torch.device("cpu"))


def test_half_precision_matrix_products_mixed_dtypes(interpreted):
    """What autocast does on CUDA: float16 U (from the GEMM) with float32 weights and input. h and c
    come back float32 as on the reference path; the backward's mixed-dtype branch (float16 gU,
    float32 highway gradient) gives the float32 gradients to float16 accuracy."""
    half_u = types.SimpleNamespace(**vars(interpreted))
    half_u.recurrence_forward = lambda U, *a, **k: interpreted.recurrence_forward(U.half(), *a, **k)
    torch.manual_seed(0)
    L, B, H = 5, 3, 16
    x = torch.randn(L, B, H, requires_grad=True)  # K = 3: the highway input is x itself
    w = (torch.randn(H, 3 * H) * 0.3).requires_grad_()
    wc, bias = torch.randn(2 * H, requires_grad=True), torch.randn(2 * H, requires_grad=True)
    c0 = torch.randn(B, 1, H, requires_grad=True)
    pad = lengths_mask([5, 2, 4], L)
    inputs = (x, w, wc, bias, c0)
    h, c = dsru.SRULayerFunction.apply(x, w, wc, bias, c0, None, pad, None, 1.5, 1, H, 3, half_u)
    assert h.dtype == c.dtype == torch.float32
    grads = torch.autograd.grad(h.sum() + c.sum(), inputs)
    U = x.reshape(L * B, H).mm(w).half().float()  # the same rounding of U
    h_ref, c_ref = dsru._recurrence_reference(U, x, wc, bias, c0, H, False, torch.tensor(1.5), None, pad)
    grads_ref = torch.autograd.grad(h_ref.sum() + c_ref.sum(), inputs)
    assert torch.allclose(h, h_ref, atol=1e-5) and torch.allclose(c, c_ref.view(B, H), atol=1e-5)
    for g, r in zip(grads, grads_ref):
        assert g.dtype == r.dtype and (g - r).abs().max() <= 2e-3 * max(1.0, r.abs().max().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("autocast", [None, torch.float16, torch.bfloat16])
def test_on_cuda_matches_reference(autocast):
    """On a real GPU: the compiled Triton kernels against the reference path, every CUDA device."""
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        torch.manual_seed(index)
        model = SRU(50, 128, num_layers=2, dropout=0.3, bidirectional=index % 2 == 1).to(device).train()
        x = torch.randn(20, 16, 50, device=device)
        mask = lengths_mask([20, 3, 7, 1] * 4, 20).to(device)
        with torch.autocast("cuda", dtype=autocast or torch.float16, enabled=autocast is not None):
            assert dsru.fast_path_status(x) == (True, None)
            torch.manual_seed(1)
            out1, c1 = model(x, mask_pad=mask, fast=True)
            g1 = torch.autograd.grad(out1.float().sum() + c1.float().sum(), list(model.parameters()))
            torch.manual_seed(1)
            out2, c2 = model(x, mask_pad=mask, fast=False)
            g2 = torch.autograd.grad(out2.float().sum() + c2.float().sum(), list(model.parameters()))
        tol = 1e-4 if autocast is None else 3e-2
        for ours, ref in [(out1, out2), (c1, c2), *zip(g1, g2)]:
            assert ours.dtype == ref.dtype
            assert (ours.double() - ref.double()).abs().max() <= tol * max(1.0, ref.abs().max().item())
