"""Fine-tuning the backbone on the texts to discover in: ``discover(..., adapt_s=SECONDS)``.

A CPU version of CLNN (contrastive learning with nearest neighbours, Zhang et al. ACL 2022, the
second stage of MTP-CLNN), on the backbone ``train="backbone"`` fine-tunes: a copy of the
classifier's pretrained backbone of which only the top
:data:`~dyntc.classifier.params.BACKBONE_LAYERS` transformer layers are trained, the frozen lower
layers' output computed once per text and kept (``core/encoders/layer_cache.py``), so that a step
runs two layers. The classifier itself is not changed: the tuned copy only places the texts for the
clustering, and is dropped after it.

1. **Neighbours.** Every text's nearest texts (the labelled support included) by the untrained
   backbone (joined to the texts' words, ``clustering.lexical``, only when ``words_weight`` is given),
   in discover's adapted metric (``clustering.adapt_metric``); fixed. As many as
   :data:`NEIGHBOURS`, and at most a quarter of the mean cluster size (texts over the known and new
   clusters), so that on few texts a text's neighbours are not half of all of them.
2. **Training**, for `budget_s` seconds of Adam steps, each the sum of two supervised contrastive
   losses (SupCon, Khosla et al. 2020) at temperature :data:`TEMPERATURE`: :data:`ANCHORS` texts, each
   with one of its neighbours drawn as its positive (a pair where one is among the other's neighbours
   counts as positive too), and up to :data:`LABELS_PER_STEP` known labels with
   :data:`EXAMPLES_PER_LABEL` support examples each, positive when they share a label, so that known
   intents stay apart.
3. Every text and support example embedded by the tuned backbone: discover clusters those points.

On StackOverflow (KCR 75 %, seeds 0-2) 360 s of training on two CPU cores lifted the product's test
scores from 77.8 / 68.4 / 80.5 to 80.6 / 72.3 / 83.5 (NMI / ARI / ACC); on M-CID's 1,200 texts 120 s
gained nothing clear (docs/discovery.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dyntc.classifier import clustering as cl
from dyntc.core.machine import seeded
from dyntc.errors import DyntcError

NEIGHBOURS = 50
TEMPERATURE = 0.07
LR = 5e-5  # Adam, the trained layers
ANCHORS = 64
LABELS_PER_STEP = 16
EXAMPLES_PER_LABEL = 4


@dataclass
class Adapted:
    """The tuned backbone's unit embeddings of the `texts` and of the `support` examples, and how the
    training went."""

    texts: np.ndarray
    support: np.ndarray
    steps: int
    train_seconds: float
    seconds: float


def neighbours(x: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """``(n, k)``: each row's `k` most similar other rows of the unit vectors `x` (cosine), unordered."""
    k = min(k, len(x) - 1)
    out = np.empty((len(x), k), dtype=np.int64)
    for start in range(0, len(x), chunk):
        sims = x[start:start + chunk] @ x.T
        sims[np.arange(len(sims)), np.arange(start, start + len(sims))] = -np.inf
        out[start:start + chunk] = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    return out


def supcon(z: torch.Tensor, positives: torch.Tensor, tau: float) -> torch.Tensor:
    """Supervised contrastive loss of the unit rows `z` with the boolean ``(B, B)`` `positives` (the
    diagonal ignored): over the rows with a positive, the mean of ``-mean_p log softmax_{j != i}(z_i ·
    z_j / tau)[p]``; 0 when no row has one."""
    eye = torch.eye(len(z), dtype=torch.bool, device=z.device)
    logits = (z @ z.T / tau).masked_fill(eye, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos = positives.to(z.device) & ~eye
    count = pos.sum(1)
    rows = count > 0
    if not bool(rows.any()):
        return z.sum() * 0.0
    return (-(log_prob.masked_fill(~pos, 0).sum(1)[rows] / count[rows])).mean()


def neighbour_positives(idx: np.ndarray, nbrs: np.ndarray) -> torch.Tensor:
    """``(B, B)`` over the texts `idx`: j is among i's neighbours, i among j's, or the same text."""
    member = (nbrs[idx][:, :, None] == idx[None, None, :]).any(1)
    return torch.from_numpy(member | member.T | (idx[:, None] == idx[None, :]))


@torch.no_grad()
def _embed(encoder, batches, n: int, size: int = 512) -> np.ndarray:
    encoder.eval()
    out = [encoder(**batches(np.arange(s, min(s + size, n)))).float().cpu().numpy() for s in range(0, n, size)]
    return cl.unit(np.concatenate(out))


def _labelled_batch(rng: np.random.Generator, groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    chosen = rng.choice(len(groups), size=min(LABELS_PER_STEP, len(groups)), replace=False)
    idx, ys = [], []
    for g in chosen:
        take = rng.choice(groups[g], size=min(EXAMPLES_PER_LABEL, len(groups[g])), replace=False)
        idx.append(take)
        ys.append(np.full(len(take), g))
    return np.concatenate(idx), np.concatenate(ys)


def train(encoder, batches, texts: np.ndarray, nbrs: np.ndarray, groups: list[np.ndarray], budget_s: float,
          seed: int, max_steps: int | None = None) -> tuple[int, float]:
    """Adam steps on `encoder`'s trainable parameters for `budget_s` seconds (at least one step, at
    most `max_steps`): `texts` the indices the anchors are drawn from, `nbrs` every index's
    neighbours, `groups` the indices of each known label's examples (those with two or more).
    Returns (steps, seconds)."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for p in encoder.parameters() if p.requires_grad], lr=LR)
    encoder.train()
    start, steps = time.perf_counter(), 0
    while steps == 0 or (time.perf_counter() - start < budget_s and (max_steps is None or steps < max_steps)):
        a = rng.choice(texts, size=min(ANCHORS, len(texts)), replace=False)
        u = np.concatenate([a, nbrs[a, rng.integers(nbrs.shape[1], size=len(a))]])
        lab, lab_y = _labelled_batch(rng, groups) if groups else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        z = encoder(**batches(np.concatenate([u, lab])))
        loss = supcon(z[:len(u)], neighbour_positives(u, nbrs), TEMPERATURE)
        if len(lab):
            loss = loss + supcon(z[len(u):], torch.from_numpy(lab_y[:, None] == lab_y[None, :]), TEMPERATURE)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    encoder.eval()
    return steps, time.perf_counter() - start


def neighbour_count(n_texts: int, n_clusters: int) -> int:
    """How many neighbours a text gets: :data:`NEIGHBOURS`, at most a quarter of the mean cluster size."""
    return max(1, min(NEIGHBOURS, n_texts // (4 * max(n_clusters, 1))))


def adapt(clf, texts: Sequence[str], support_texts: Sequence[str], support_y: np.ndarray, n_clusters: int,
          budget_s: float, seed: int, shrink: float, words_weight: float = 0.0) -> Adapted:
    """Fine-tune a copy of `clf`'s backbone on `texts` and the labelled `support_texts` (their
    known-cluster ids `support_y`) for `budget_s` seconds of training, the neighbours taken in the
    metric ``adapt_metric(..., shrink)`` over the points joined to the texts' latent-semantic
    vectors at `words_weight` (`n_clusters`: known and new, for their number); see the module docstring."""
    from dyntc.classifier.tuning import tunable_network

    start = time.perf_counter()
    with seeded(seed):
        encoder = tunable_network(clf).encoder
        encoder.to(str(clf.device))
        unique = list(dict.fromkeys([*support_texts, *texts]))
        where = {t: i for i, t in enumerate(unique)}
        batches = encoder.training_collator(encoder.featurize(unique))
        device = torch.device(str(clf.device))

        def on_device(idx):
            return {k: v.to(device) for k, v in batches(idx).items()}

        x = _embed(encoder, on_device, len(unique))
        sup = np.array([where[t] for t in support_texts], dtype=np.int64)
        lexical = cl.lexical(unique, seed=seed) if words_weight else None
        near = x if lexical is None else cl.joined(x, lexical, words_weight)
        w = cl.adapt_metric(near[sup], support_y, shrink)
        nbrs = neighbours(cl.unit(near @ w), neighbour_count(len(unique), n_clusters))
        groups = [g for g in (sup[support_y == c] for c in np.unique(support_y)) if len(g) > 1]
        anchors = np.array([where[t] for t in dict.fromkeys(texts)], dtype=np.int64)
        steps, train_s = train(encoder, on_device, anchors, nbrs, groups, budget_s, seed)
        x = _embed(encoder, on_device, len(unique))
        return Adapted(texts=x[[where[t] for t in texts]], support=x[sup], steps=steps, train_seconds=train_s,
                       seconds=time.perf_counter() - start)


def check_adaptable(clf) -> None:
    """A clear error unless `clf`'s encoder is a pretrained backbone that can be fine-tuned."""
    from dyntc.core.encoders import encoder_kind

    encoder = clf.get_params()["encoder"]
    if "backbone" not in encoder_kind(encoder).train_modes:
        raise DyntcError(f"adapt_s fine-tunes a pretrained backbone before clustering; encoder {encoder!r} has none "
                         "(use encoder='minilm' or the path of a sentence-transformers model), or leave adapt_s=None")
