"""Shared by the tests of the training loops, of early stopping and of the research probes: a small
SRU on SENT, and untrained copies of it."""

import copy

SMALL = dict(hidden_size=64, num_layers=2, max_len=32, dropout=0.1)
# The paper's lr of 1e-3 needs ~1,000+ episodes to leave the collapsed start (loss at chance) on
# SENT; 1e-2 gets a small model there in ~100 episodes, which keeps these end-to-end tests short.
FAST_LR = 1e-2


def fresh(encoder):
    """An untrained copy: the module-scoped encoder itself is never trained."""
    return copy.deepcopy(encoder)
