"""Speed benchmarks, run as ``python -m bench.<name>``; each prints ratios against peers timed in
the same run.

Like the ``dyntc`` command (see ``dyntc/cli/__init__.py``), the benchmarks make idle OpenMP
threads sleep instead of spin (``OMP_WAIT_POLICY=PASSIVE``, set here before torch loads) so that
they measure what the command runs; all peers in a run share the setting. Set
``OMP_WAIT_POLICY=ACTIVE`` (or anything else) in the environment to measure another policy.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
