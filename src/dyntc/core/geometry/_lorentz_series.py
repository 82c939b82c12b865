"""Series thresholds and coefficients of the hyperboloid's scalar functions, and the constants of the
Fréchet-mean solvers' step search: shared by :mod:`dyntc.core.geometry.lorentz` (PyTorch) and
:mod:`dyntc.core.geometry._lorentz_kernels` (numba), so that neither imports the other. t = B(x, y) - 1 >= 0,
s = d², q = |v|².
"""

import math

_T_SERIES = 1e-3  # below this, use Taylor series in t (truncation error < 1e-18 relative)
_Q_SERIES = 1e-4  # the same for series in q = |v|² or s = d²

# arccosh(1 + t)² = 2 sum_{n>=1} (-1)^{n+1} (2t)^n / (n² C(2n, n))      (= 2t - t²/3 + 4t³/45 - ...)
_ACOSH_SQ = [2.0 * (-1) ** (n + 1) * 2.0**n / (n * n * math.comb(2 * n, n)) for n in range(1, 8)]
# d / sinh d = arccosh(1+t) / sqrt(t (t + 2)) = 2F1(1, 1; 3/2; -t/2) = sum_k k! / (3/2)_k (-t/2)^k
_D_OVER_SINH = [1.0]
for _k in range(1, 7):
    _D_OVER_SINH.append(_D_OVER_SINH[-1] * _k / (_k + 0.5) * -0.5)
# (d coth d - 1) / d² in s = d²:  1/3 - s/45 + 2 s²/945 - s³/4725
_KAPPA = [1.0 / 3.0, -1.0 / 45.0, 2.0 / 945.0, -1.0 / 4725.0]
# cosh(sqrt q) = sum q^k / (2k)!,   sinh(sqrt q) / sqrt q = sum q^k / (2k+1)!
_COSH = [1.0 / math.factorial(2 * k) for k in range(5)]
_SINHC = [1.0 / math.factorial(2 * k + 1) for k in range(5)]
# the step search of the Fréchet-mean solvers (both use these): Armijo constant, most halvings
_ARMIJO_C1 = 1e-4
_MAX_HALVINGS = 40
