"""The numerics of new-intent discovery: small pure functions over unit vectors (numpy, float32).

* :func:`adapt_metric` learns, from the labelled support points alone, a linear map that shrinks the
  directions in which texts of one label differ (within-label scatter, shrunk towards the identity)
  and applies it to every point: wording that does not change the intent weighs less, for new
  intents as for known ones (a closed form; nothing is trained).
* :func:`lexical` adds the texts' words: latent semantic vectors (TF-IDF, truncated SVD) fitted on the
  texts being clustered, to be joined to the encoder's points at a small weight; a product name or an
  error code that the sentence encoder blurs separates two intents by itself.
* :func:`seeded_kmeans` is semi-supervised spherical k-means: one centroid per known label, seeded
  at its prototype and holding its labelled points, plus ``n_new`` centroids seeded by greedy
  k-means++ among the unlabelled points far from every known prototype; unlabelled points move freely.
  :func:`swap_search` then moves new centroids to where Lloyd's iterations could not take them (into a
  known label's cluster that holds a new intent too) while the objective rises, and
  :func:`split_search` tries the parts of known labels' clusters that hold too few of the label's
  examples (:func:`unsupported_parts`) as places to move one to.
* :func:`estimate_new` chooses ``n_new`` when it is not given: over-cluster and count the new
  clusters about as large as the known labels' (DeepAligned's rule, at least the mean size, when the
  known labels hold few of the texts).
* :func:`keywords` names a cluster by class-based TF-IDF (c-TF-IDF): the words frequent in the
  cluster and rare in the others.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def group_sums(ids: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """``(k, d)``: the sum of the rows of `x` with each id (a sparse product; ``np.add.at`` is ~50x slower)."""
    from scipy.sparse import csr_matrix

    ids = np.asarray(ids, dtype=np.int64)
    onehot = csr_matrix((np.ones(len(ids), np.float32), (ids, np.arange(len(ids)))), shape=(k, len(ids)))
    return np.asarray(onehot @ x, dtype=np.float32)


# ---------------------------------------------------------------------------------------- the metric


def adapt_metric(known: np.ndarray, known_y: np.ndarray, shrink: float = 0.5) -> np.ndarray:
    """A ``(d, d)`` map ``W`` to apply as ``unit(x @ W)``: the inverse square root of the labelled
    points' within-label scatter, shrunk towards the identity by `shrink` (1 = no change; with few
    labelled points per dimension the raw scatter is singular). Labels with one point add nothing."""
    known = unit(known)
    d = known.shape[1]
    centred = np.empty_like(known)
    used = np.zeros(len(known), dtype=bool)
    for c in np.unique(known_y):
        idx = np.flatnonzero(known_y == c)
        if len(idx) > 1:
            centred[idx] = known[idx] - known[idx].mean(0)
            used[idx] = True
    if used.sum() < 2:
        return np.eye(d, dtype=np.float32)
    scatter = centred[used].T @ centred[used] / used.sum()
    scatter = scatter / max(np.trace(scatter) / d, 1e-12)  # unit mean eigenvalue, comparable with I
    scatter = (1 - shrink) * scatter + shrink * np.eye(d)
    values, vectors = np.linalg.eigh(scatter.astype(np.float64))
    return (vectors @ np.diag(values.clip(1e-6) ** -0.5) @ vectors.T).astype(np.float32)


def lexical(texts: Sequence[str], dims: int = 256, seed: int | None = 0) -> np.ndarray | None:
    """``(n, k)`` unit latent-semantic vectors of `texts`: sublinear TF-IDF over :func:`words` found in
    at least two of them, reduced to ``k = min(dims, vocabulary - 1, n - 1)`` dimensions by truncated
    SVD (seeded). None when fewer than two such words exist (nothing to add)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    try:
        counts = TfidfVectorizer(analyzer=words, sublinear_tf=True, min_df=2, dtype=np.float32).fit_transform(texts)
    except ValueError:  # no word in two texts
        return None
    k = min(dims, counts.shape[1] - 1, len(texts) - 1)
    if k < 1:
        return None
    return unit(TruncatedSVD(k, random_state=seed).fit_transform(counts))


def joined(points: np.ndarray, word_vectors: np.ndarray, weight: float) -> np.ndarray:
    """Unit rows of ``[points, weight · word_vectors]`` (both unit rows, or zero where a text has no
    word of the vocabulary): cosine becomes ``(cos_points + weight² · cos_words) / (1 + weight²)``."""
    return unit(np.hstack([unit(points), weight * word_vectors]))


# ---------------------------------------------------------------------------------------- clustering


def _plus_plus(points: np.ndarray, centroids: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` more centroids among unit `points` by greedy k-means++ (Arthur and Vassilvitskii 2007, as
    scikit-learn's ``KMeans`` seeds), given `centroids` already chosen: per centroid, ``2 + ln k``
    candidates (``k`` all the centroids) drawn with probability proportional to the squared distance
    to the nearest centroid so far (``|a - b|² = 2 - 2 cos``), the one that leaves the smallest total
    of those distances kept. One candidate drawn by the squared cosine distance instead placed 150
    intents' centroids worse (docs/discovery.md)."""
    trials = 2 + int(np.log(max(len(centroids) + n, 2)))
    best = (points @ centroids.T).max(1) if len(centroids) else np.full(len(points), -1.0, np.float32)
    out = []
    for _ in range(n):
        weight = np.clip(1.0 - best, 0, None)
        total = weight.sum()
        candidates = (rng.choice(len(points), size=trials, p=weight / total) if total > 0
                      else rng.integers(len(points), size=trials))
        sims = points @ points[candidates].T
        potentials = np.clip(1.0 - np.maximum(best[:, None], sims), 0, None).sum(0)
        j = int(np.argmin(potentials))
        out.append(points[candidates[j]])
        best = np.maximum(best, sims[:, j])
    return np.array(out, dtype=np.float32).reshape(n, points.shape[1])


def seeded_kmeans(points: np.ndarray, known: np.ndarray, known_y: np.ndarray, n_known: int, n_new: int, *,
                  seed: int = 0, n_init: int = 3, max_iter: int = 50, swaps: bool = False, splits: bool = False,
                  min_size: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
    """Semi-supervised spherical k-means on unit vectors.

    `points` ``(n, d)`` unlabelled; `known` ``(m, d)`` labelled with `known_y` in ``0..n_known-1``
    (they stay in their label's cluster). Returns ``(assignment of points in 0..n_known+n_new-1,
    centroids (n_known+n_new, d), objective = mean cosine to the own centroid)``, best of `n_init`
    seedings of the new centroids; with `swaps`, that best then improved by :func:`swap_search`, and
    with `splits` by :func:`split_search` after it (`min_size`: their smallest new cluster that counts)."""
    rng = np.random.default_rng(seed)
    seeds = unit(group_sums(known_y, known, n_known))
    both = np.concatenate([points, known])
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for _ in range(max(1, n_init) if n_new else 1):
        result = lloyd(points, both, known_y, np.concatenate([seeds, _plus_plus(points, seeds, n_new, rng)]), max_iter)
        if best is None or result[2] > best[2]:
            best = result
    if swaps and n_new:
        best = swap_search(points, both, known_y, n_known, best, rng, max_iter=max_iter, min_size=min_size)
    if splits and n_new:
        best = split_search(points, both, known_y, n_known, best, max_iter=max_iter, min_size=min_size)
    return best


def lloyd(points: np.ndarray, both: np.ndarray, known_y: np.ndarray, centroids: np.ndarray,
          max_iter: int = 50) -> tuple[np.ndarray, np.ndarray, float]:
    """Lloyd's iterations from `centroids` until no unlabelled point changes cluster (at most
    `max_iter`): ``(assignment of points, centroids, objective)``. `both` is `points` followed by the
    labelled points, which stay in their `known_y` clusters."""
    k = len(centroids)
    assign = None
    for _ in range(max_iter):
        sims = points @ centroids.T
        new_assign = sims.argmax(1)
        if assign is not None and np.array_equal(new_assign, assign):
            break
        assign = new_assign
        ids = np.concatenate([assign, known_y])
        sums = group_sums(ids, both, k)
        sizes = np.bincount(ids, minlength=k)
        empty = np.flatnonzero(sizes == 0)
        if len(empty):  # re-seed an emptied centroid at the point farthest from its own
            far = np.argsort(sims[np.arange(len(points)), assign])[:len(empty)]
            sums[empty] = points[far]
        centroids = unit(sums)
    sims = points @ centroids.T
    assign = sims.argmax(1)
    objective = float(sims[np.arange(len(points)), assign].mean()) if len(points) else 0.0
    return assign, centroids, objective


#: the local search of :func:`swap_search`: candidate points drawn per round, how many of the best of
#: them and of the cheapest new centroids to remove are paired in a round (10 x 5 = 50 trials at most)
SWAP_CANDIDATES, SWAP_ADDS, SWAP_REMOVALS = 1024, 10, 5


def swap_estimates(points: np.ndarray, centroids: np.ndarray, n_known: int,
                   candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """With every centroid held where it is, ``(gain, loss)``: ``gain[i]`` how much the summed cosine
    of the unit `points` to their nearest centroid grows when unit row ``candidates[i]`` is added as a
    centroid, ``loss[j]`` how much it drops when new centroid ``n_known + j`` is removed (its points go
    to their second nearest)."""
    sims = points @ centroids.T
    nearest = sims.argmax(1)
    best = sims[np.arange(len(points)), nearest]
    sims[np.arange(len(points)), nearest] = -np.inf
    second = sims.max(1) if centroids.shape[0] > 1 else np.full(len(points), -1.0, np.float32)
    gain = np.clip(points @ candidates.T - best[:, None], 0, None).sum(0)
    loss = np.bincount(nearest, weights=best - second, minlength=len(centroids))[n_known:]
    return gain, loss


def swap_search(points: np.ndarray, both: np.ndarray, known_y: np.ndarray, n_known: int,
                result: tuple[np.ndarray, np.ndarray, float], rng: np.random.Generator, *,
                max_iter: int = 50, min_size: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
    """Local search over the new centroids, the swap heuristic of Kanungo et al. (2004): move one new
    centroid to a point, run :func:`lloyd`, keep the move when the objective rises. Lloyd's
    iterations alone leave a new intent inside a close known label when no new centroid was seeded
    near it (on CLINC150 a third of the new intents' texts stayed in known labels, docs/discovery.md):
    a centroid moved there draws its texts away, and one of two centroids that split an intent between
    them is what it costs. Per round, :data:`SWAP_CANDIDATES` points drawn like k-means++ seeds (by
    ``1 - cos`` to their nearest centroid); the :data:`SWAP_ADDS` of them that would gain most paired
    with the :data:`SWAP_REMOVALS` new centroids that cost least (:func:`swap_estimates`), tried in
    that order until one raises the objective without leaving fewer new clusters of at least
    `min_size` points (a centroid moved onto a stray point gains by it, and is dropped as noise);
    stops at a round without one, or after ``2 · n_new`` moves. The known centroids are never moved
    by a swap: their labels' points hold them."""
    n_new = len(result[1]) - n_known
    for _ in range(2 * n_new):
        nearest = (points @ result[1].T).max(1)
        weight = np.clip(1.0 - nearest, 0, None) + 1e-9
        drawn = rng.choice(len(points), size=min(SWAP_CANDIDATES, len(points)), replace=False, p=weight / weight.sum())
        gain, loss = swap_estimates(points, result[1], n_known, points[drawn])
        moved = None
        for i in np.argsort(-gain)[:SWAP_ADDS]:
            moved = _moved(points, both, known_y, n_known, result, points[drawn[i]], np.argsort(loss)[:SWAP_REMOVALS],
                           max_iter, min_size)
            if moved is not None:
                break
        if moved is None:
            break
        result = moved
    return result


def _proposed(assign: np.ndarray, n_centroids: int, n_known: int, min_size: int) -> int:
    """How many new clusters hold at least `min_size` points."""
    return int((np.bincount(assign, minlength=n_centroids)[n_known:] >= min_size).sum())


def _moved(points: np.ndarray, both: np.ndarray, known_y: np.ndarray, n_known: int,
           result: tuple[np.ndarray, np.ndarray, float], centre: np.ndarray, removals: np.ndarray, max_iter: int,
           min_size: int) -> tuple[np.ndarray, np.ndarray, float] | None:
    """The move of a search: `centre` in place of new centroid ``n_known + j`` for each j of `removals` in
    turn, then :func:`lloyd`; the first result whose objective is higher and that leaves no fewer new
    clusters of at least `min_size` points, or None."""
    assign, centroids, objective = result
    kept = _proposed(assign, len(centroids), n_known, min_size)
    for j in removals:
        trial = centroids.copy()
        trial[n_known + j] = centre
        candidate = lloyd(points, both, known_y, trial, max_iter)
        if candidate[2] > objective + 1e-7 and _proposed(candidate[0], len(centroids), n_known, min_size) >= kept:
            return candidate
    return None


#: :func:`split_search`: the cheapest new centroids tried per candidate part, and the level of the test
#: under which a part of a known label's cluster holds too few of the label's examples
SPLIT_REMOVALS, SPLIT_LEVEL = 5, 0.05


def unsupported_parts(points: np.ndarray, known: np.ndarray, known_y: np.ndarray, n_known: int, assign: np.ndarray,
                      *, min_size: int = 1, level: float = SPLIT_LEVEL, max_iter: int = 10
                      ) -> list[tuple[float, int, np.ndarray]]:
    """Parts of known labels' clusters that the label's own examples do not cover, most unlikely first:
    ``[(p-value, known id, unit centre)]``. A label's examples are drawn from its texts, so any large
    part of its cluster holds its share of them; a new intent held in the label's cluster holds none.
    Per known id with at least two examples and ``2 · min_size`` unlabelled points: two-means of its
    points and examples (one centre started at the examples' mean, the other at the mean of the half
    of the points farthest from it; the examples move freely), and the binomial probability of so few
    examples in the far part given its share of the cluster; a part of at least `min_size` points
    below `level` is kept."""
    from scipy.stats import binom

    out = []
    for k in range(n_known):
        members, examples = np.flatnonzero(assign == k), np.flatnonzero(known_y == k)
        if len(examples) < 2 or len(members) < 2 * min_size:
            continue
        both = np.concatenate([points[members], known[examples]])
        near = unit(known[examples].mean(0, keepdims=True))[0]
        cos = points[members] @ near
        far = unit(points[members][cos <= np.median(cos)].mean(0, keepdims=True))[0]
        for _ in range(max_iter):
            in_far = both @ far > both @ near
            if in_far.all() or not in_far.any():
                break
            near, far = unit(both[~in_far].mean(0, keepdims=True))[0], unit(both[in_far].mean(0, keepdims=True))[0]
        in_far = both @ far > both @ near
        if in_far[:len(members)].sum() < min_size or in_far.all():
            continue
        p = float(binom.cdf(int(in_far[len(members):].sum()), len(examples), float(in_far.mean())))
        if p < level:
            out.append((p, k, far))
    return sorted(out, key=lambda part: part[0])


def split_search(points: np.ndarray, both: np.ndarray, known_y: np.ndarray, n_known: int,
                 result: tuple[np.ndarray, np.ndarray, float], *, max_iter: int = 50, min_size: int = 1
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """The swap heuristic of :func:`swap_search` with other candidates: the centres of the parts of
    known labels' clusters that the labels' examples do not cover (:func:`unsupported_parts`). The
    swap search draws its candidates by their distance to the nearest centroid, and a new intent
    inside a close known label is near that label's centroid: on CLINC150 (KCR 75 %) a fifth to a
    third of the new intents' texts stayed in known labels after it (docs/discovery.md). Per round, the
    parts in order of their p-value, each paired with the :data:`SPLIT_REMOVALS` new centroids that
    cost least (:func:`swap_estimates`), until a move raises the objective without leaving fewer new
    clusters of at least `min_size` points; a part that failed is not tried again while its label's
    cluster keeps its size. Stops at a round without a move, or after ``2 · n_new`` moves."""
    n_new = len(result[1]) - n_known
    known = both[len(points):]
    failed = set()
    for _ in range(2 * n_new):
        assign, centroids, _ = result
        parts = [(k, centre, (k, int((assign == k).sum())))
                 for _, k, centre in unsupported_parts(points, known, known_y, n_known, assign, min_size=min_size)]
        parts = [part for part in parts if part[2] not in failed]
        if not parts:
            break
        _, loss = swap_estimates(points, centroids, n_known, centroids[:1])
        cheapest = np.argsort(loss)[:SPLIT_REMOVALS]
        moved = None
        for _, centre, key in parts:
            moved = _moved(points, both, known_y, n_known, result, centre, cheapest, max_iter, min_size)
            if moved is not None:
                break
            failed.add(key)
        if moved is None:
            break
        result = moved
    return result


def estimate_new(points: np.ndarray, known: np.ndarray, known_y: np.ndarray, n_known: int, max_new: int, *,
                 min_size: int = 3, seed: int = 0, n_init: int = 1) -> tuple[int, list[int]]:
    """The number of new clusters among `points`, from an over-clustering (Zhang et al. AAAI 2021,
    DeepAligned: a real intent gathers more texts than the surplus centroids, which split a few texts
    among them). Returns it (at least 1) and the new clusters' sizes in the last over-clustering,
    largest first.

    Over-cluster into ``2 · max(n_known, 10)`` new clusters (at most `max_new`) and count those of at
    least half the median size of the known labels' clusters in the same clustering: a new intent is
    about as frequent as a known one. When that count reaches half the clusters tried, the bound may
    be what limits it: double it (up to `max_new`) and count again. When half that median is below
    `min_size` (the smallest cluster kept), the known labels hold too few of the texts for their sizes
    to say anything of a new intent's (say, only the texts the classifier could not place):
    DeepAligned's own rule then, `max_new` new clusters and those of at least the mean cluster size."""
    tried = min(max_new, 2 * max(n_known, 10))
    while True:
        assign, _, _ = seeded_kmeans(points, known, known_y, n_known, tried, seed=seed, n_init=n_init, max_iter=30)
        sizes = np.bincount(assign, minlength=n_known + tried)
        known_sizes, new_sizes = sizes[:n_known], sizes[n_known:]
        if np.median(known_sizes) / 2 < min_size:
            if tried < max_new:  # the known labels' sizes are no guide: DeepAligned's rule
                tried = max_new
                continue
            count = int((new_sizes >= len(points) / (n_known + tried)).sum())
        else:
            count = int((new_sizes >= np.median(known_sizes) / 2).sum())
        if count < tried / 2 or tried >= max_new:
            return max(1, count), sorted(new_sizes.tolist(), reverse=True)
        tried = min(max_new, 2 * tried)


# ---------------------------------------------------------------------------------------- names

_WORD = re.compile(r"[a-z0-9][a-z0-9+#'._-]*[a-z0-9+#]|[a-z0-9]")
STOPWORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before being below between
both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each few for from
further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself his
how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor
not of off on once only or other ought our ours ourselves out over own same shan't she she'd she'll she's should
shouldn't so some such than that that's the their theirs them themselves then there there's these they they'd
they'll they're they've this those through to too under until up very was wasn't we we'd we'll we're we've were
weren't what what's when when's where where's which while who who's whom why why's with won't would wouldn't you
you'd you'll you're you've your yours yourself yourselves please tell want need know get give like just also
one use using way get got make
""".split())


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS and not w.isdigit()]


def keywords(groups: Sequence[Sequence[str]], top: int = 3) -> list[list[str]]:
    """The `top` c-TF-IDF words of every group of texts: ``tf(w, group) · log(1 + mean words per group
    / count of w over all groups)``."""
    counts = [Counter(w for t in texts for w in words(t)) for texts in groups]
    total: Counter = Counter()
    for c in counts:
        total.update(c)
    mean_words = sum(total.values()) / max(len(groups), 1)
    out = []
    for c in counts:
        n = sum(c.values()) or 1
        scored = sorted(c, key=lambda w: (-(c[w] / n) * np.log(1 + mean_words / total[w]), w))
        out.append(scored[:top])
    return out
