"""Benchmark: batched Fréchet mean (damped Riemannian Newton) vs the paper's fixed-step rule.

    python -m bench.frechet

150 classes x 20 points x 128 dims, points ``project(randn * scale)``, float64, CPU. For each
scale: median (and min) wall time of ``lorentz.frechet_mean`` (default tol 1e-10) and of
``lorentz.paper_mean`` (step 0.01, 100 iterations, from p̃), the largest Riemannian gradient norm
``|grad F|`` (``F = mean_i d(p, x_i)²``) over the classes at each result, and the largest hyperbolic
distance from each result to the "true" mean (``frechet_mean`` with ``tol=1e-14``).
"""

from __future__ import annotations

import statistics
import time

import torch

from dyntc.geometry import lorentz

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
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for scale in SCALES:
        x = lorentz.project(torch.randn(CLASSES, POINTS, DIM, dtype=torch.float64) * scale)
        true, true_info = lorentz.frechet_mean(x, tol=1e-14, max_iter=50, return_info=True)
        t_ours, min_ours, (ours, info) = timed(lambda: lorentz.frechet_mean(x, return_info=True), 9)
        t_paper, min_paper, paper = timed(lambda: lorentz.paper_mean(x, lr=0.01, iters=100), 3)
        spread = lorentz.distance(true.unsqueeze(-2), x).mean().item()
        print(f"scale {scale:g}: mean distance of points to their class mean {spread:.2f}")
        print(f"  frechet_mean : {t_ours * 1e3:8.2f} ms (min {min_ours * 1e3:7.2f})  iterations {info['iterations']:3d}  "
              f"max |grad F| {grad_norm(ours, x).max().item():.2e}  "
              f"max dist to true mean {lorentz.distance(ours, true).max().item():.2e}")
        print(f"  paper_mean   : {t_paper * 1e3:8.2f} ms (min {min_paper * 1e3:7.2f})  iterations 100  "
              f"max |grad F| {grad_norm(paper, x).max().item():.2e}  "
              f"max dist to true mean {lorentz.distance(paper, true).max().item():.2e}")
        print(f"  time ratio paper/ours: {t_paper / t_ours:.1f}x (median), {min_paper / min_ours:.1f}x (min)  "
              f"(true mean: {true_info['iterations']} iterations, max |grad F| "
              f"{true_info['grad_norm'].max().item():.1e})")


if __name__ == "__main__":
    main()
