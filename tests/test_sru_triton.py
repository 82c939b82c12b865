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

from dyntc.encoders import sru as dsru
from dyntc.encoders.sru import SRU

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'dyntc[gpu]')")


@pytest.fixture(scope="module")
def interpreted():
    """A private copy of ``dyntc.encoders._sru_triton`` whose kernels run in Triton's interpreter
    (decided when ``triton.jit`` decorates them, so the copy is loaded with the variable set)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.find_spec("dyntc.encoders._sru_triton")
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
    """float16 inputs: read and written in float16, the recurrence in float32, so the result is
    the float32 one rounded (not float16 arithmetic accumulated over the steps)."""
    torch.manual_seed(0)
    L, B, I, H = 30, 4, 16, 16
    x = torch.randn(L, B, I)
    w = torch.randn(I, 3 * H) * 0.3  # K = 3 (I == H)
    wc, bias, c0 = torch.randn(2 * H), torch.randn(2 * H), torch.zeros(B, 1, H)
    args = (None, None, None, 1.0, 1, H, 3, interpreted, False)
    h16, c16, _ = dsru._layer_forward(x.half(), w.half(), wc, bias, c0, *args)
    h32, c32, _ = dsru._layer_forward(x.half().float(), w.half().float(), wc, bias, c0, *args)
    assert h16.dtype == torch.float16 and c16.dtype == torch.float32
    assert (h16.float() - h32).abs().max() <= 2e-3 * h32.abs().max()
    assert (c16 - c32).abs().max() <= 2e-3 * c32.abs().max()


def _signature(kernel, pointers: dict[str, str], constexprs: dict) -> dict[str, str]:
    ints = {"L", "B", "D", "H"}
    return {
        a: "constexpr" if a in constexprs else "i32" if a in ints else pointers.get(a, pointers["*"])
        for a in kernel.arg_names
    }


@pytest.mark.parametrize("arch", [80, 90])
def test_triton_kernels_compile_for_cuda(arch, tmp_path, monkeypatch):
    """Every kernel variant (K = 3/4, masks, padding, training) and dtype compiles to a cubin for
    sm_{arch} (A100 / H100): no GPU needed, so a kernel that would not build is caught here."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from triton.backends.compiler import GPUTarget

    from dyntc.encoders import _sru_triton as tr

    target = GPUTarget("cuda", arch, 32)
    for (state, io), flags in itertools.product(
        [("fp32", "fp32"), ("fp64", "fp64"), ("fp32", "fp16"), ("fp32", "bf16")],
        [(False, False, False), (True, True, True), (False, True, False), (True, False, True)],
    ):
        k4, has_mask, has_pad = flags
        if arch == 80 and io == "bf16" and flags[0]:
            continue  # (covered by the other variants; keeps the test short)
        for kernel, io_args in ((tr._forward_kernel, ("U", "X", "H_OUT")), (tr._backward_kernel, ("U", "X", "GH", "GU", "GX"))):
            const = dict(K4=k4, HAS_MASK=has_mask, HAS_PAD=has_pad, BLOCK_H=32)
            if "TRAIN" in kernel.arg_names:
                const["TRAIN"] = has_mask
            pointers = {"*": "*" + state, "PAD": "*u8", **{a: "*" + io for a in io_args}}
            src = triton.compiler.ASTSource(fn=kernel, signature=_signature(kernel, pointers, const), constexprs=const)
            compiled = triton.compile(src, target=target)
            assert len(compiled.asm["cubin"]) > 1000, (kernel, state, io, flags)


def _fake_cuda_tensor(dtype=torch.float32):
    """What fast_path_status looks at (device type, dtype) without needing CUDA."""
    return types.SimpleNamespace(device=torch.device("cuda"), dtype=dtype)


def test_cuda_dispatch_reasons(monkeypatch):
    monkeypatch.setattr(dsru, "_loaded", {})
    monkeypatch.setattr(dsru, "_load_errors", {})
    ok, reason = dsru.fast_path_status(_fake_cuda_tensor(torch.int32))
    assert not ok and "torch.int32" in reason and "triton" in reason and "float16" in reason
    if not torch.cuda.is_available():  # the self-test cannot run: a clean refusal with the reason
        ok, reason = dsru.fast_path_status(_fake_cuda_tensor())
        assert not ok and reason.startswith("triton unavailable (") and "CUDA" in reason
    monkeypatch.setattr(dsru, "_load_errors", {})
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "dyntc.encoders._sru_triton", raising=False)
    ok, reason = dsru.fast_path_status(_fake_cuda_tensor())
    assert not ok and reason.startswith("triton unavailable (ModuleNotFoundError")
    assert dsru.fast_path_status(torch.zeros(1))[0]  # the CPU backend is unaffected


def test_self_test_rejects_wrong_kernels(interpreted, monkeypatch):
    """A backend whose kernels compute something else is refused by the self-test."""
    dsru._self_test(interpreted, torch.device("cpu"))  # the real kernels pass, also when first used
    with torch.inference_mode():  # for inference
        dsru._self_test(interpreted, torch.device("cpu"))
    broken = types.SimpleNamespace(**vars(interpreted))

    def wrong_forward(*args, **kwargs):
        h, c, saved = interpreted.recurrence_forward(*args, **kwargs)
        return h * 1.01, c, saved

    broken.recurrence_forward = wrong_forward
    with pytest.raises(RuntimeError, match="self-test"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dsru._self_test(broken, torch.device("cpu"))
