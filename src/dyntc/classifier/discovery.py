"""New-intent discovery: group texts the label set does not cover into proposed labels.

:func:`discover` takes a :class:`~dyntc.classifier.labels.LabelSet` and the points of unlabelled
texts (embedded by the classifier's own encoder) and returns a :class:`Discovery`: the proposed new
clusters and, for every text, the existing label, the new cluster, or None (noise) it belongs to.
:func:`add_clusters` turns chosen clusters into labels. ``DynamicClassifier.discover`` / ``accept``
are :func:`discover_for` / :func:`accept`.

How (the measurements behind each step are in docs/discovery.md):

0. **Words.** Each point is joined to its text's latent-semantic vector (TF-IDF over the texts and
   the support examples, truncated SVD; :func:`~dyntc.classifier.clustering.lexical`) at weight
   :data:`WORDS_WEIGHT` (``words_weight``): a product name or an error code the sentence encoder
   blurs still separates two intents. On StackOverflow it lifts the protocol's scores by 2-9 points.
1. **Metric.** The support examples already say which wording differences do not change an intent:
   the points are mapped by the inverse square root of the support's within-label scatter (shrunk
   towards the identity; :func:`~dyntc.classifier.clustering.adapt_metric`). On frozen MiniLM this
   step alone lifts M-CID from NMI 61 to 81.
2. **Clustering.** Semi-supervised spherical k-means with one centroid per known label (or per part
   of a merged label), seeded at its prototype and holding its support points, and ``n_new`` more
   seeded by greedy k-means++ among the texts far from every known label
   (:func:`~dyntc.classifier.clustering.seeded_kmeans`); in the default mode, new centroids are then
   moved one at a time while the objective rises (:func:`~dyntc.classifier.clustering.swap_search`),
   which frees new intents that Lloyd's iterations leave inside a close known label, then moved into
   the parts of known labels' clusters that hold too few of the label's examples
   (:func:`~dyntc.classifier.clustering.split_search`) while the objective rises.
3. **How many.** Without ``n_new``, on the points without the words: over-cluster (twice as many
   new clusters as known labels, more while the count nears that bound, at most ``max_new``) and
   count the new clusters about as large as the known labels'
   (:func:`~dyntc.classifier.clustering.estimate_new`).
4. **Noise.** A new cluster with fewer than ``min_cluster_size`` texts is dropped; its texts get None.
5. **Names.** Each cluster is named by its c-TF-IDF keywords (else its most central text's words)
   and reports its most central texts, cohesion (mean cosine to its centre in the adapted metric)
   and the nearest existing label with its distance in the classifier's own metric.

With ``adapt_s`` (``discover_for``), a copy of the pretrained backbone's top layers is first fine-tuned
on the texts and the support sets by contrastive learning with nearest neighbours, and steps 1-5 run
on its points (:mod:`~dyntc.classifier.discovery_tuning`); the classifier is left as it was.

A :class:`Discovery` remembers the label set it was made on; :func:`add_clusters` refuses it once that
set has changed (labels added, removed or renamed): run ``discover`` again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from dyntc.classifier import clustering as cl
from dyntc.classifier import discovery_tuning, live_head
from dyntc.classifier.discovery_tuning import Adapted
from dyntc.classifier.labels import LabelSet, check_examples
from dyntc.errors import DyntcError, is_int, is_number

MODES = ("default", "fast")
#: per mode: restarts of the new centroids' seeding, and the swap and split searches after them
#: (clustering.swap_search, clustering.split_search)
MODE_SETTINGS = {"default": {"n_init": 3, "swaps": True, "splits": True},
                 "fast": {"n_init": 1, "swaps": False, "splits": False}}
MIN_CLUSTER_SIZE = 3
SHRINK = 0.5  # of the within-label scatter towards the identity (adapt_metric)
WORDS_WEIGHT = 0.3  # of the texts' latent-semantic vectors beside the encoder's unit points (clustering.lexical)
# with adapt_s: the backbone tuned on the texts carries what their words add (docs/discovery.md: joined to
# them, it scored lower on StackOverflow than without them)
ADAPTED_WORDS_WEIGHT = 0.0
CENTRAL_TEXTS = 5


@dataclass
class Cluster:
    """A proposed new label: ``name`` (unique against the label set and the other clusters), its
    ``texts`` (most central first), ``size``, ``cohesion`` (mean cosine of its texts to its centre,
    1 = identical), ``keywords``, ``central_texts``, and the ``nearest_label`` with its
    ``nearest_distance`` in the classifier's metric."""

    name: str
    texts: list[str]
    size: int
    cohesion: float
    keywords: list[str]
    central_texts: list[str]
    nearest_label: str | None
    nearest_distance: float | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Discovery:
    """What :func:`discover` found: ``clusters`` (largest first), ``assignments`` (one per input text,
    in input order: an existing label, a cluster's name, or None for noise), ``n_new`` (clusters
    asked for or estimated, before small ones were dropped), ``estimated`` (whether ``n_new`` was
    estimated) with the ``overclustered_sizes`` the estimate counted, the ``label_set`` it was made
    on, the ``settings`` and ``seconds`` it took."""

    texts: list[str]
    clusters: list[Cluster]
    assignments: list[str | None]
    n_new: int
    estimated: bool
    label_set: list[str]
    settings: dict
    seconds: float
    overclustered_sizes: list[int] = field(default_factory=list)

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise DyntcError(f"no cluster named {name!r} in this discovery; its clusters: "
                         f"{', '.join(c.name for c in self.clusters) or '(none)'}")

    def counts(self) -> dict[str, int]:
        """Texts per outcome: ``known`` (an existing label), ``new`` (a cluster), ``noise``."""
        names = {c.name for c in self.clusters}
        new = sum(a in names for a in self.assignments)
        noise = sum(a is None for a in self.assignments)
        return {"known": len(self.assignments) - new - noise, "new": new, "noise": noise}

    def to_dict(self, texts_per_cluster: int | None = None) -> dict:
        """JSON-able; `texts_per_cluster` caps each cluster's listed texts (None = all)."""
        clusters = []
        for c in self.clusters:
            d = c.to_dict()
            if texts_per_cluster is not None:
                d["texts"] = d["texts"][:texts_per_cluster]
            clusters.append(d)
        return {"clusters": clusters, "assignments": [{"text": t, "label": a} for t, a in zip(self.texts, self.assignments)],
                "counts": self.counts(), "n_new": self.n_new, "estimated": self.estimated,
                "overclustered_sizes": list(self.overclustered_sizes),
                "label_set": list(self.label_set), "settings": dict(self.settings), "seconds": round(self.seconds, 3)}


# ---------------------------------------------------------------------------------------- checks


def check_texts(texts: Sequence[str], min_texts: int) -> list[str]:
    """Non-empty, distinct texts, at least `min_texts` of them."""
    texts = check_examples(texts, "texts", allow_empty=True)
    seen: dict[str, int] = {}
    for i, t in enumerate(texts):
        if t in seen:
            raise DyntcError(f"texts[{i}] repeats texts[{seen[t]}] ({t[:60]!r}): pass each text once "
                             "(deduplicate first; a repeated text would weigh twice in the clusters)")
        seen[t] = i
    if len(texts) < min_texts:
        raise DyntcError(f"discover needs at least {min_texts} texts to cluster (min_cluster_size x 2), got "
                         f"{len(texts)}: collect more unplaced texts first")
    return texts


def _check_int(value, name: str, lo: int, hi: int | None = None, why: str = "") -> int:
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise DyntcError(f"{name} must be an integer {rng}{why}, got {value!r}")
    return int(value)


def check_seed(seed) -> int | None:
    """`seed` of the clustering: an integer >= 0, or None for a fresh random draw (numpy's convention)."""
    if seed is not None and not (is_int(seed) and seed >= 0):
        raise DyntcError(f"seed must be an integer >= 0 (or None for a fresh random draw), got {seed!r}")
    return seed


def default_max_new(n_texts: int, n_known: int, min_cluster_size: int) -> int:
    """The largest number of new clusters the estimate considers: four times the known labels (at
    least 40), and no more than the texts allow at `min_cluster_size` each."""
    return max(1, min(n_texts // min_cluster_size, 4 * max(n_known, 10)))


# ---------------------------------------------------------------------------------------- discover


def _known(labels: LabelSet) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Support directions, their known-cluster ids (one per label part) and each id's label."""
    pts, ids, owners = [], [], []
    for name, support in labels.items():
        ids.append(len(owners) + support.part_ids().numpy())
        owners.extend([name] * support.n_parts)
        pts.append(live_head.directions(labels.space, support.points))
    return np.concatenate(pts), np.concatenate(ids), owners


def unique_name(base: str, taken: set[str]) -> str:
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def check_options(labels: LabelSet, texts: Sequence[str], n_new: int | None = None, *, max_new: int | None = None,
                  min_cluster_size: int = MIN_CLUSTER_SIZE, mode: str = "default", seed: int | None = 0,
                  words_weight: float = WORDS_WEIGHT) -> tuple[list[str], int | None, dict]:
    """:func:`discover`'s arguments checked, nothing embedded: (texts, n_new, settings), the
    settings holding the mode's, ``min_cluster_size``, ``seed``, ``words_weight`` and ``max_new``
    (its default filled in)."""
    if mode not in MODES:
        raise DyntcError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not is_number(words_weight) or not 0 <= words_weight <= 10:
        raise DyntcError(f"words_weight must be a number from 0 (the encoder's points alone) to 10, "
                         f"got {words_weight!r}")
    min_cluster_size = _check_int(min_cluster_size, "min_cluster_size", 1)
    seed = check_seed(seed)
    texts = check_texts(texts, 2 * min_cluster_size)
    limit = len(texts) // min_cluster_size
    why = f" ({len(texts)} texts, min_cluster_size={min_cluster_size})"
    if n_new is not None:
        n_new = _check_int(n_new, "n_new", 1, limit, why)
    if max_new is None:
        max_new = default_max_new(len(texts), sum(support.n_parts for _, support in labels.items()), min_cluster_size)
    else:
        max_new = _check_int(max_new, "max_new", 1, limit, why)
    return texts, n_new, {"mode": mode, "min_cluster_size": min_cluster_size, "seed": seed, "shrink": SHRINK,
                          "words_weight": float(words_weight), **MODE_SETTINGS[mode], "max_new": max_new}


def discover(labels: LabelSet, texts: Sequence[str], points: torch.Tensor, n_new: int | None = None, *,
             max_new: int | None = None, min_cluster_size: int = MIN_CLUSTER_SIZE, mode: str = "default",
             seed: int = 0, words_weight: float = WORDS_WEIGHT,
             adapt: Callable[[list[str], np.ndarray, int, int, float], Adapted] | None = None) -> Discovery:
    """Cluster `texts` (their `points` in the label set's space) into the labels of `labels` and new
    clusters; see the module docstring. `n_new` new clusters (None: estimated, at most `max_new`).
    `words_weight`: of the texts' latent-semantic vectors beside the points (0: the points alone).
    `adapt` (``(support texts, their known-cluster ids, number of clusters, seed, words_weight) ->
    Adapted``): called once the options are checked, its points of the texts and of the support replace
    theirs in the clustering (a backbone fine-tuned on them, ``discovery_tuning.py``)."""
    start = time.perf_counter()
    texts, n_new, settings = check_options(labels, texts, n_new, max_new=max_new, min_cluster_size=min_cluster_size,
                                           mode=mode, seed=seed, words_weight=words_weight)
    if len(points) != len(texts):
        raise DyntcError(f"{len(texts)} texts but {len(points)} points")
    known, known_y, owners = _known(labels)
    min_cluster_size, seed, max_new = settings["min_cluster_size"], settings["seed"], settings["max_new"]
    words_weight = settings["words_weight"]

    directions = live_head.directions(labels.space, points)
    support_texts = [t for _, support in labels.items() for t in support.texts]  # _known's order
    if adapt is not None:
        adapted = adapt(support_texts, known_y, len(owners) + (max_new if n_new is None else n_new),
                        int(np.random.default_rng().integers(2**31)) if seed is None else seed, words_weight)
        directions, known = adapted.texts, adapted.support
        settings.update(adapt_steps=adapted.steps, adapt_train_s=round(adapted.train_seconds, 1))
    sizes: list[int] = []
    estimated = n_new is None
    if estimated:  # counted without the words: with them the error grew (docs/discovery.md, the number of new intents)
        w = cl.adapt_metric(known, known_y, SHRINK)
        n_new, sizes = cl.estimate_new(cl.unit(directions @ w), cl.unit(known @ w), known_y, len(owners), max_new,
                                       min_size=min_cluster_size, seed=seed)
    lexical = cl.lexical(list(texts) + support_texts, seed=seed) if words_weight else None
    if lexical is not None:
        directions = cl.joined(directions, lexical[:len(texts)], words_weight)
        known = cl.joined(known, lexical[len(texts):], words_weight)
    w = cl.adapt_metric(known, known_y, SHRINK)
    x, kx = cl.unit(directions @ w), cl.unit(known @ w)
    assign, centroids, _ = cl.seeded_kmeans(x, kx, known_y, len(owners), n_new, seed=seed,
                                            n_init=settings["n_init"], swaps=settings["swaps"],
                                            splits=settings["splits"], min_size=min_cluster_size)
    clusters, outcome = _clusters(labels, texts, points, x, assign, centroids, owners, min_cluster_size)
    return Discovery(texts=list(texts), clusters=clusters, assignments=outcome, n_new=int(n_new),
                     estimated=estimated, label_set=labels.classes, settings=settings,
                     seconds=time.perf_counter() - start, overclustered_sizes=sizes)


def _clusters(labels: LabelSet, texts: list[str], points: torch.Tensor, x: np.ndarray, assign: np.ndarray,
              centroids: np.ndarray, owners: list[str], min_size: int) -> tuple[list[Cluster], list[str | None]]:
    n_known = len(owners)
    outcome: list[str | None] = [owners[a] if a < n_known else None for a in assign]
    members = {k: np.flatnonzero(assign == k) for k in range(n_known, len(centroids))}
    kept = sorted((k for k, idx in members.items() if len(idx) >= min_size), key=lambda k: -len(members[k]))
    if not kept:
        return [], outcome
    sims = {k: x[members[k]] @ centroids[k] for k in kept}
    order = {k: members[k][np.argsort(-sims[k], kind="stable")] for k in kept}
    # keywords against every group (known labels' texts included), so that words common to all are not names
    groups = [[texts[i] for i in order[k]] for k in kept]
    known_groups = [[texts[i] for i in np.flatnonzero(assign == k)] for k in range(n_known)]
    words = cl.keywords(groups + [g for g in known_groups if g])[:len(kept)]
    protos = labels.space.means([points[torch.as_tensor(order[k], dtype=torch.long)] for k in kept])
    d2 = labels.sq_distances(protos).clamp_min(0)
    nearest = d2.argmin(1).tolist() if len(labels) else [None] * len(kept)
    taken = set(labels.classes)
    clusters = []
    for j, k in enumerate(kept):
        idx = order[k]
        base = "_".join(words[j]) or "_".join(cl.words(texts[idx[0]])[:3]) or "new_intent"
        name = unique_name(base, taken)
        taken.add(name)
        for i in idx:
            outcome[i] = name
        clusters.append(Cluster(
            name=name, texts=[texts[i] for i in idx], size=len(idx), cohesion=round(float(sims[k].mean()), 6),
            keywords=list(words[j]), central_texts=[texts[i] for i in idx[:CENTRAL_TEXTS]],
            nearest_label=None if nearest[j] is None else labels.classes[nearest[j]],
            nearest_distance=None if nearest[j] is None else round(float(d2[j, nearest[j]].sqrt()), 6)))
    return clusters, outcome


# ---------------------------------------------------------------------------------------- the classifier's methods


def discover_for(clf, texts: Sequence[str], n_new: int | None = None, *, adapt_s: float | None = None,
                 **options) -> Discovery:
    """``DynamicClassifier.discover(texts, n_new=None, *, adapt_s=None, **options)``: group `texts`
    (distinct, unlabelled) into the existing labels and `n_new` proposed new clusters (None:
    estimated); `options`: ``max_new``, ``min_cluster_size``, ``mode`` (``"default"`` or
    ``"fast"``), ``seed`` (default: the classifier's), ``words_weight``. `adapt_s`: first fine-tune a
    copy of the pretrained backbone's top layers on the texts and the support sets for this many
    seconds of training, and cluster in its space (``discovery_tuning.py``; minutes, not seconds), by default
    without the words (``words_weight`` :data:`ADAPTED_WORDS_WEIGHT`). Changes nothing: ``accept``
    adds clusters."""
    texts = check_discover(clf, texts, n_new, adapt_s=adapt_s, **options)  # before minutes of embedding or training
    adapt = None
    if adapt_s is not None:
        options = {"words_weight": ADAPTED_WORDS_WEIGHT, **options}
        def adapt_backbone(support_texts, support_y, n_clusters, seed, words_weight):
            return discovery_tuning.adapt(clf, texts, support_texts, support_y, n_clusters, float(adapt_s), seed, SHRINK,
                                          words_weight)
        adapt = adapt_backbone
    found = discover(clf.labels_, texts, clf.space_.embed(texts), n_new, adapt=adapt, **{"seed": clf.seed, **options})
    found.settings["adapt_s"] = adapt_s
    return found


def check_discover(clf, texts: Sequence[str], n_new: int | None = None, *, adapt_s: float | None = None,
                   **options) -> list[str]:
    """Every check ``DynamicClassifier.discover`` makes before its work, in milliseconds (a service
    checks a request with it before starting a job of minutes); returns the texts as a list."""
    from dyntc.classifier.tuning import check_budget

    clf._check_fitted()
    if adapt_s is not None:
        check_budget(adapt_s, "adapt_s")
        discovery_tuning.check_adaptable(clf)
    return check_options(clf.labels_, texts, n_new, **{"seed": clf.seed, **options})[0]


def accept(clf, discovery: "Discovery", clusters=None, *, add_examples: bool = False) -> list[str]:
    """``DynamicClassifier.accept(discovery, clusters=None, *, add_examples=False)``: add the chosen
    clusters of `discovery` (None = all; names or 0-based positions) as labels, in one label-set
    change (one version when saved or committed). A discovery made before the label set changed is
    refused. With `add_examples` the texts it assigned to existing labels join them. Returns the new
    label set."""
    add_clusters(clf.labels_, discovery, clusters, add_examples=add_examples)
    return clf._labels_changed()


# ---------------------------------------------------------------------------------------- accept


def chosen(discovery: Discovery, clusters=None) -> list[Cluster]:
    """The clusters named by `clusters`: None = all; else cluster names or positions (0-based) in
    ``discovery.clusters``."""
    if not isinstance(discovery, Discovery):
        raise DyntcError(f"accept takes the Discovery returned by discover(), got {type(discovery).__name__}")
    if clusters is None:
        return list(discovery.clusters)
    if isinstance(clusters, (str, int)):
        clusters = [clusters]
    out = []
    for c in clusters:
        if is_int(c):
            if not 0 <= c < len(discovery.clusters):
                raise DyntcError(f"cluster position {c} is out of range: this discovery has "
                                 f"{len(discovery.clusters)} clusters (0-based positions)")
            out.append(discovery.clusters[c])
        elif isinstance(c, str):
            out.append(discovery.cluster(c))
        else:
            raise DyntcError(f"clusters must be cluster names or 0-based positions, got {c!r}")
    if len({id(c) for c in out}) != len(out):
        raise DyntcError("clusters names a cluster twice")
    return out


def check_fresh(discovery: Discovery, labels: LabelSet) -> None:
    """Refuse a discovery made on another label set (its assignments and names refer to that one)."""
    now = labels.classes
    if now != discovery.label_set:
        added = sorted(set(now) - set(discovery.label_set))
        removed = sorted(set(discovery.label_set) - set(now))
        raise DyntcError(f"this discovery is stale: the label set changed since it was made (added: "
                         f"{added[:5] or 'none'}, removed: {removed[:5] or 'none'}); run discover() again on "
                         "the current labels")


def add_clusters(labels: LabelSet, discovery: Discovery, clusters=None, *, add_examples: bool = False) -> list[str]:
    """Add the chosen clusters of `discovery` to `labels` as labels (their texts are the support); with
    `add_examples`, the texts assigned to existing labels also join those labels. Returns the new labels."""
    if not isinstance(discovery, Discovery):
        raise DyntcError(f"accept takes the Discovery returned by discover(), got {type(discovery).__name__}")
    check_fresh(discovery, labels)
    if not isinstance(add_examples, bool):
        raise DyntcError(f"add_examples must be True or False, got {add_examples!r}")
    picked = chosen(discovery, clusters)
    if not picked and not add_examples:
        raise DyntcError("nothing to accept: this discovery proposes no new cluster")
    for c in picked:
        labels.add_label(c.name, c.texts)
    if add_examples:
        by_label: dict[str, list[str]] = {}
        for t, a in zip(discovery.texts, discovery.assignments):
            if a is not None and a in discovery.label_set:
                by_label.setdefault(a, []).append(t)
        for name, examples in by_label.items():
            labels.add_examples(name, examples)
    return [c.name for c in picked]
