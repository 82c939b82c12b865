"""Benchmark: batched Fréchet mean (damped Riemannian Newton) vs the paper's fixed-step rule.

    python -m bench.frechet

150 classes x 20 points x 128 dims, points ``project(randn * scale)``, float64, CPU. For each
scale: median (and min) wall time of ``lorentz.frechet_mean`` (default tol 1e-10) with its compiled
CPU solver (numba, the default) and with its batched PyTorch solver (``USE_COMPILED = False``, the
path on GPUs), and of ``lorentz.paper_mean`` (step 0.01, 100 iterations, from p̃), the largest
Riemannian gradient norm
``|grad F|`` (``F = mean_i d(p, x_i)²``) over the classes at each result, and the largest hyperbolic
distance from each result to the "true" mean (``frechet_mean`` with ``tol=1e-14``). Then
episode-sized sets (training) and large sets (labels with many examples, dev-time prototypes).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench._machine import load_average, omp_wait_policy
from dyntc.core.geometry import lorentz

CLASSES, POINTS, DIM = 150, 20, 128
SCALES = (0.1, 1.0, 3.0, 10.0)


def grad_norm(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|grad F| at p for F = mean_i d(p, x_i)², via the public log map: 2 |mean_i log_p(x_i)|."""
    r = lorentz.log_map(p.unsqueeze(-2), x).mean(-2)
    return 2.0 * (-lorentz.inner(r, r)).clamp_min(0.0).sqrt()


def timed(fn, repeats: int) -> tuple[float, float, torch.Tensor]:
    """(median, min) wall time over ``repeats`` runs after a warm-up, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def main() -> None:
    torch.manual_seed(0)
    print(f"Frechet mean benchmark: {CLASSES} classes x {POINTS} points x {DIM} dims, float64, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load_average()}, "
          f"OMP_WAIT_POLICY={omp_wait_policy()}")
    for scale in SCALES:
        x = lorentz.project(torch.randn(CLASSES, POINTS, DIM, dtype=torch.float64) * scale)
        true, true_info = lorentz.frechet_mean(x, tol=1e-14, max_iter=50, return_info=True)
        t_ours, min_ours, (ours, info) = timed(lambda: lorentz.frechet_mean(x, return_info=True), 21)
        lorentz.USE_COMPILED = False
        t_torch, min_torch, (ours_torch, info_torch) = timed(lambda: lorentz.frechet_mean(x, return_info=True), 9)
        lorentz.USE_COMPILED = None
        t_paper, min_paper, paper = timed(lambda: lorentz.paper_mean(x, lr=0.01, iters=100), 3)
        spread = lorentz.distance(true.unsqueeze(-2), x).mean().item()
        print(f"scale {scale:g}: mean distance of points to their class mean {spread:.2f}")
        print(f"  frechet_mean  : {t_ours * 1e3:8.2f} ms (min {min_ours * 1e3:7.2f})  iterations {info['iterations']:3d}  "
              f"max |grad F| {grad_norm(ours, x).max().item():.2e}  "
              f"max dist to true mean {lorentz.distance(ours, true).max().item():.2e}")
        print(f"  PyTorch solver: {t_torch * 1e3:7.2f} ms (min {min_torch * 1e3:7.2f})  iterations {info_torch['iterations']:3d}  "
              f"max |grad F| {grad_norm(ours_torch, x).max().item():.2e}  "
              f"max dist to true mean {lorentz.distance(ours_torch, true).max().item():.2e}")
        print(f"  paper_mean    : {t_paper * 1e3:8.2f} ms (min {min_paper * 1e3:7.2f})  iterations 100  "
              f"max |grad F| {grad_norm(paper, x).max().item():.2e}  "
              f"max dist to true mean {lorentz.distance(paper, true).max().item():.2e}")
        print(f"  time ratios (median): paper / ours {t_paper / t_ours:.1f}x, PyTorch solver / compiled {t_torch / t_ours:.1f}x  "
              f"(true mean: {true_info['iterations']} iterations, max |grad F| "
              f"{true_info['grad_norm'].max().item():.1e})")

    # the size a training episode needs (N_C classes x N_S = 4 support points, float32 embeddings)
    for classes in (10, 50):
        x = lorentz.project(torch.randn(classes, 4, DIM) * 0.5)
        w = torch.ones(classes, 4)  # models.prototypes always passes its class mask as weights
        t_fast, _, _ = timed(lambda: lorentz.frechet_mean(x, w, max_iter=5), 51)
        lorentz.USE_COMPILED = False
        t_torch, _, _ = timed(lambda: lorentz.frechet_mean(x, w, max_iter=5), 21)
        lorentz.USE_COMPILED = None
        print(f"episode-sized {classes} classes x 4 points x {DIM} dims, float32 in, weights, max_iter=5 (training): "
              f"compiled {t_fast * 1e3:.2f} ms, PyTorch solver {t_torch * 1e3:.2f} ms ({t_torch / t_fast:.1f}x)")

    # large sets: past COMPILED_MAX_POINTS the default is the PyTorch solver (its Newton system is
    # (d+1)-dimensional once n > d+1); the kernel is forced past its limit up to 256 points to compare
    limit = lorentz.COMPILED_MAX_POINTS
    for sets, points in ((1, 200), (10, 128), (10, 256), (10, 2000)):
        x = lorentz.project(torch.randn(sets, points, DIM, dtype=torch.float64) * 0.5)
        lorentz.USE_COMPILED = False
        line = f"PyTorch solver {timed(lambda: lorentz.frechet_mean(x), 5)[0] * 1e3:.1f} ms"
        if points <= 256:  # the kernel's n x n system takes minutes at 2,000 points
            lorentz.USE_COMPILED, lorentz.COMPILED_MAX_POINTS = True, points
            line = f"compiled {timed(lambda: lorentz.frechet_mean(x), 5)[0] * 1e3:.1f} ms, " + line
        lorentz.USE_COMPILED, lorentz.COMPILED_MAX_POINTS = None, limit
        default = "compiled" if points <= limit else "PyTorch"
        print(f"{sets} sets x {points} points x {DIM} dims, float64: {line} (default: {default})")

if __name__ == "__main__":
    main()
