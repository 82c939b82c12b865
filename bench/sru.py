"""Speed of dyntc's SRU against sru 2.6.0, nn.LSTM and the matrix products alone (float32).

    python -m bench.sru [--reps N] [--no-compile-timing] [--shapes 144x200,144x32] [--device cuda]

The paper's encoder: 4 layers, hidden 128, input 50 (frozen GloVe, so no gradient w.r.t. the
input), dropout 0.5 between layers. For every shape (batch x length) it prints the median wall time
of a training step (forward in training mode with dropout + backward of ``output.sum()``) and
of an inference call (eval mode, ``torch.no_grad``) for:

* ``dyntc fast``  -- dyntc.core.encoders.sru.SRU, numba kernels (Triton kernels with ``--device cuda``);
* ``dyntc ref``   -- the same module on its pure-PyTorch reference path;
* ``sru 2.6.0``   -- sru.SRU with the same weights (its CPU training path is a Python loop; its
  inference path is its compiled C++ loop; on CUDA its own CUDA kernel, forward and backward);
* ``nn.LSTM``     -- torch.nn.LSTM(50, 128, 4 layers, dropout 0.5), a peer;
* ``matmul floor``-- the SRU's matrix products alone (U = x W per layer, and their backward for
  training) into preallocated outputs, i.e. what is left if the elementwise recurrence and all
  memory allocation were free.

and the ratios sru / dyntc and dyntc / matmul floor. Then, for the longest shape, the training step
with the encoder's real loss, ``output[-1].sum()`` (the gradient reaches early steps only through
the forget gates and decays into float32 denormals, which slow down sru's and the reference path's
PyTorch ops; dyntc's kernel flushes them). For the shortest shape: the recurrence kernels of one
layer alone (ns per element), and an A/B of the OpenMP wait policy in fresh processes
(``--omp-pairs``). No assertions: timings on a shared machine are noisy (the load average is
printed next to them). With ``--device cuda`` every timed call ends with
``torch.cuda.synchronize()``; the kernel breakdown and the OpenMP A/B (CPU matters) are skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
from torch import nn

from bench._machine import cpu_model, load_average, omp_wait_policy
from dyntc.errors import DyntcError
from dyntc.core.machine import check_device

INPUT, HIDDEN, LAYERS, DROPOUT = 50, 128, 4, 0.5


def timeit(fn, reps: int, budget_s: float) -> float:
    """Median seconds of `fn()` over `reps` runs after one warm-up (fewer if over `budget_s`)."""
    t = time.perf_counter()
    fn()
    if time.perf_counter() - t > budget_s / 3:  # very slow entry: one more run is enough
        reps = 1
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps and (len(times) < min(2, reps) or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, x, last_only: bool = False):
    """Forward in training mode + backward of ``output.sum()`` (every step gets a gradient), or of
    ``output[-1].sum()`` with `last_only` (the encoder's last-token loss)."""

    def step():
        model.zero_grad(set_to_none=True)
        out = model(x)[0]
        (out[-1] if last_only else out).sum().backward()
        _synchronize(x.device)

    return step


def infer_step(model, x):
    def step():
        with torch.no_grad():
            model(x)
        _synchronize(x.device)

    return step


def matmul_floor(batch: int, length: int, train: bool, device: torch.device):
    """The SRU layers' matrix products with no recurrence in between: per layer U = x W, and for
    training also dW = x^T dU and (layers > 0; the first layer's input is frozen) dx = dU W^T.
    Outputs go to preallocated buffers, so this is the GEMM work alone."""
    sizes = [(INPUT, HIDDEN * 4)] + [(HIDDEN, HIDDEN * 3)] * (LAYERS - 1)
    rows = length * batch
    dev = dict(device=device)
    ws = [torch.randn(i, o, **dev) for i, o in sizes]
    xs = [torch.randn(rows, i, **dev) for i, _ in sizes]
    gs = [torch.randn(rows, o, **dev) for _, o in sizes]
    us = [torch.empty(rows, o, **dev) for _, o in sizes]
    gws = [torch.empty(i, o, **dev) for i, o in sizes]
    gxs = [torch.empty(rows, i, **dev) for i, _ in sizes]

    def step():
        for n, (x, w) in enumerate(zip(xs, ws)):
            torch.mm(x, w, out=us[n])
        if train:
            for n in reversed(range(LAYERS)):
                torch.mm(xs[n].t(), gs[n], out=gws[n])
                if n > 0:
                    torch.mm(gs[n], ws[n].t(), out=gxs[n])
        _synchronize(device)

    return step


def compile_timing() -> str:
    """First-call time of the fast path in a fresh process with an empty numba cache (compile),
    and in a second process that loads that cache."""
    code = (
        "import time, torch; t0 = time.perf_counter();"
        "from dyntc.core.encoders.sru import SRU; m = SRU(50, 128, 4, dropout=0.5); x = torch.randn(8, 4, 50);"
        "t = time.perf_counter(); m(x)[0].sum().backward(); t1 = time.perf_counter() - t;"
        "m.eval(); t = time.perf_counter();\nwith torch.no_grad(): m(x)\nt2 = time.perf_counter() - t;"
        "print(f'{t1:.1f} s (forward+backward), {t2:.1f} s (inference)')"
    )
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold numba cache", "warm numba cache"):
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            line = res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else res.stderr.strip()[-300:]
            out.append(f"  first call, {label}: {line}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per entry (median)")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per entry before stopping early (min 2 reps)")
    parser.add_argument("--shapes", default="144x200,144x32", help="batch x length, comma-separated")
    parser.add_argument("--no-compile-timing", action="store_true")
    parser.add_argument("--omp-pairs", type=int, default=4,
                        help="alternating process pairs for the OpenMP wait-policy A/B (0: skip)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    try:  # every option checked before anything is built
        device = check_device(args.device)
        shapes = [tuple(int(v) for v in shape.lower().split("x")) for shape in args.shapes.split(",")]
    except (DyntcError, ValueError) as exc:
        parser.error(str(exc) if isinstance(exc, DyntcError) else f"--shapes must look like 144x200,144x32, got {args.shapes!r}")
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes) or args.reps < 1 or args.budget <= 0:
        parser.error("--shapes must be BATCHxLENGTH pairs of positive integers, --reps >= 1 and --budget > 0")
    gpu = device.type == "cuda"

    warnings.filterwarnings("ignore", module="sru")
    warnings.filterwarnings("ignore", message=".*Running SRU on CPU with grad_enabled.*")
    warnings.filterwarnings("ignore", message=".*CUDA kernels of SRU.*")
    try:
        import sru  # noqa: F401  (compiles its C++ CPU extension on first import)

        sru_error = None
    except Exception as exc:  # pragma: no cover - depends on the machine
        sru, sru_error = None, f"{type(exc).__name__}: {exc}"

    from dyntc.core.encoders import sru as dsru

    import numba

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}; numba {numba.__version__}")
    print(f"model: {LAYERS} layers x {HIDDEN} hidden, input {INPUT}, dropout {DROPOUT}, float32; "
          f"load average before: {load_average()}; OMP_WAIT_POLICY={omp_wait_policy()}")
    if gpu:
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "not installed"
        print(f"GPU: {torch.cuda.get_device_name(device)}; CUDA {torch.version.cuda}; triton {triton_version}")
    if sru_error:
        print(f"sru 2.6.0 unavailable: {sru_error}")
    if not args.no_compile_timing and not gpu:
        print(compile_timing())

    torch.manual_seed(0)
    fast = dsru.SRU(INPUT, HIDDEN, num_layers=LAYERS, dropout=DROPOUT).to(device)
    ok, reason = dsru.fast_path_status(torch.zeros(1, device=device))
    if not ok:
        print(f"WARNING: dyntc fast path unavailable: {reason}")
    ref_model = _Reference(fast)
    peers: dict[str, nn.Module] = {"dyntc fast": fast, "dyntc ref": ref_model}
    if sru is not None:
        theirs = sru.SRU(INPUT, HIDDEN, num_layers=LAYERS, dropout=DROPOUT, rescale=True)
        theirs.load_state_dict(fast.state_dict())
        peers["sru 2.6.0"] = theirs.to(device)
    peers["nn.LSTM"] = nn.LSTM(INPUT, HIDDEN, num_layers=LAYERS, dropout=DROPOUT).to(device)

    header = f"{'shape BxT':>10} {'model':<13} {'train ms':>10} {'infer ms':>10}"
    for batch, length in shapes:
        shape = f"{batch}x{length}"
        x = torch.randn(length, batch, INPUT, device=device)
        print()
        print(header)
        res: dict[str, tuple[float, float]] = {}
        for name, model in peers.items():
            model.train()
            slow_cpu_loop = name == "dyntc ref" or (name == "sru 2.6.0" and not gpu)
            reps = args.reps if not (slow_cpu_loop and length > 64) else min(args.reps, 3)
            tr = timeit(train_step(model, x), reps, args.budget)
            model.eval()
            inf = timeit(infer_step(model, x), args.reps, args.budget)
            res[name] = (tr, inf)
            print(f"{shape:>10} {name:<13} {tr * 1e3:10.1f} {inf * 1e3:10.1f}", flush=True)
        floor = (timeit(matmul_floor(batch, length, True, device), args.reps, args.budget),
                 timeit(matmul_floor(batch, length, False, device), args.reps, args.budget))
        res["matmul floor"] = floor
        print(f"{shape:>10} {'matmul floor':<13} {floor[0] * 1e3:10.1f} {floor[1] * 1e3:10.1f}")
        f_tr, f_inf = res["dyntc fast"]
        if "sru 2.6.0" in res:
            s_tr, s_inf = res["sru 2.6.0"]
            print(f"{shape:>10} ratio sru 2.6.0 / dyntc fast: training {s_tr / f_tr:.2f}x, inference {s_inf / f_inf:.2f}x")
        print(f"{shape:>10} ratio dyntc fast / matmul floor: training {f_tr / floor[0]:.2f}x, inference {f_inf / floor[1]:.2f}x")
        l_tr, l_inf = res["nn.LSTM"]
        print(f"{shape:>10} ratio nn.LSTM / dyntc fast: training {l_tr / f_tr:.2f}x, inference {l_inf / f_inf:.2f}x")
    batch, length = max(shapes, key=lambda bt: bt[1])
    x = torch.randn(length, batch, INPUT, device=device)
    print(f"\nlast-token loss output[-1].sum(), {batch}x{length}, training step:")
    last = {}
    for name in ("dyntc fast", "sru 2.6.0"):
        if name in peers:
            peers[name].train()
            last[name] = timeit(train_step(peers[name], x, last_only=True), 3, args.budget)
            print(f"  {name:<13} {last[name] * 1e3:10.1f} ms")
    if len(last) == 2:
        print(f"  ratio sru 2.6.0 / dyntc fast: {last['sru 2.6.0'] / last['dyntc fast']:.2f}x")
    batch, length = min(shapes, key=lambda bt: bt[1])
    shortest = f"{batch}x{length}"
    if not gpu:  # where the CPU time goes
        print(f"\nkernels alone, one 128 -> 128 layer, {shortest} (ns per element = time / (B T H)):")
        print(kernel_times(batch, length, args.reps))
        if args.omp_pairs > 0:
            print(f"\nOpenMP wait policy, dyntc training step {shortest}, separate processes (median of 30 steps each):")
            print(omp_wait_policy_ab(batch, length, args.omp_pairs))
    print(f"\nload average after: {load_average()} (on a shared machine the absolute numbers are noisy)")


def kernel_times(batch: int, length: int, reps: int) -> str:
    """The numba recurrence kernels of one layer (K = 3, hidden 128) without the GEMMs, on this
    process's torch thread count and on one thread: where the rest of a training step goes."""
    from dyntc.core.encoders import _sru_kernels as kernels

    hidden = HIDDEN
    U = torch.randn(length, batch, 1, 3, hidden)
    x = torch.randn(length, batch, 1, hidden)
    weight_c, bias, c0 = torch.randn(2 * hidden), torch.zeros(2 * hidden), torch.zeros(batch, 1, hidden)
    grad_h = torch.randn(length, batch, 1, hidden)
    elements = length * batch * hidden
    lines = []
    threads = torch.get_num_threads()
    for n in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(n)
        saved = kernels.recurrence_forward(U, x, 1.0, weight_c, bias, c0, None, None, True)[2]
        fwd = timeit(lambda: kernels.recurrence_forward(U, x, 1.0, weight_c, bias, c0, None, None, True), reps * 3, 5.0)
        bwd = timeit(lambda: kernels.recurrence_backward(saved, grad_h, None), reps * 3, 5.0)
        lines.append(f"  {n} thread(s): forward (training) {fwd * 1e3:.2f} ms = {fwd * 1e9 / elements:.1f} ns/element, "
                     f"backward {bwd * 1e3:.2f} ms = {bwd * 1e9 / elements:.1f} ns/element")
    torch.set_num_threads(threads)
    return "\n".join(lines)


def omp_wait_policy_ab(batch: int, length: int, pairs: int) -> str:
    """Training-step time in fresh processes with OMP_WAIT_POLICY=PASSIVE (dyntc's default) and
    ACTIVE, alternating (the policy is read when torch loads, so it cannot change in-process)."""
    code = (
        "import statistics, time, torch; from dyntc.core.encoders.sru import SRU; torch.manual_seed(0);"
        f"m = SRU({INPUT}, {HIDDEN}, {LAYERS}, dropout={DROPOUT}); x = torch.randn({length}, {batch}, {INPUT});\n"
        "def step():\n    m.zero_grad(set_to_none=True); m(x)[0].sum().backward()\n"
        "[step() for _ in range(5)]; ts = []\n"
        "for _ in range(30):\n    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)\n"
        "print(statistics.median(ts))"
    )
    times: dict[str, list[float]] = {"PASSIVE": [], "ACTIVE": []}
    for _ in range(pairs):
        for policy in times:
            env = dict(os.environ, OMP_WAIT_POLICY=policy)
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            if res.returncode != 0:
                return f"  failed: {res.stderr.strip()[-300:]}"
            times[policy].append(float(res.stdout.strip().splitlines()[-1]))
    return "\n".join(f"  {policy:<8} " + " ".join(f"{t * 1e3:.1f}" for t in ts) + " ms" for policy, ts in times.items())


class _Reference(nn.Module):
    """The same SRU forced onto its pure-PyTorch reference path."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x, fast=False)


if __name__ == "__main__":
    main()
