"""Measured: how many of the new intents' texts ``discover`` leaves inside known labels, without its
swap search, with it, and with the split search after it.

Lloyd's iterations of ``clustering.seeded_kmeans`` cannot take a new centroid into a known label's
cluster: when no new centroid is seeded near a new intent that sits close to a known label (CLINC150's
"timer" beside "alarm"), the label keeps the intent's texts, and the centroids spent elsewhere split
some other intent. ``clustering.swap_search`` (the default mode) moves new centroids while the
objective rises, and ``clustering.split_search`` after it moves them into the parts of known labels'
clusters that the labels' examples do not cover. This probe runs the protocol's split of
``bench/discovery.py`` (KCR, LAR 10 %, seed), ``DynamicClassifier(seed).fit(labelled)`` and
``discover(unlabelled, n_new)`` with ``n_new`` given, three times (neither search, the swap search alone,
both: the default), and prints, for the unlabelled training texts (no test text is used):

* the share of the new intents' texts assigned to a known label, and the new intents with most of
  their texts in one known label (absorbed);
* the share of the known intents' texts assigned to their own label;
* NMI / ARI / ACC of the assignment against the true intents, ``discover``'s seconds, and its
  clustering's objective (mean cosine of the unlabelled points to their centroid, in discover's space);
* then the same objective and scores for Lloyd's iterations (``clustering.lloyd``) started from the
  true intents' centroids in that space: what the objective gives where the search starts right.

    DYNTC_DATA=/path/to/datasets python research/discovery_absorbed.py --dataset clinc150 --kcr 0.75 --seed 0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def absorbed_report(truth: dict[str, str], known: set[str], texts: list[str], assignments: list) -> dict:
    """Counts over `texts` (each with its true intent in `truth`) and their `assignments` (a known
    label, a new cluster's name, or None)."""
    new_idx = [i for i, t in enumerate(texts) if truth[t] not in known]
    known_idx = [i for i, t in enumerate(texts) if truth[t] in known]
    per_intent: dict[str, Counter] = {}
    for i in new_idx:
        per_intent.setdefault(truth[texts[i]], Counter())[assignments[i]] += 1
    absorbed = sorted(intent for intent, got in per_intent.items()
                      if any(label in known and n > sum(got.values()) / 2 for label, n in got.items()))
    return {"new_texts_in_known": sum(assignments[i] in known for i in new_idx) / max(1, len(new_idx)),
            "absorbed": absorbed, "new_intents": len(per_intent),
            "known_texts_right": sum(assignments[i] == truth[texts[i]] for i in known_idx) / max(1, len(known_idx))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="clinc150")
    parser.add_argument("--kcr", type=float, default=0.75)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.discovery import cpu_name, protocol_split, scores

    import numpy as np

    from dyntc import DynamicClassifier
    from dyntc.classifier import clustering, discovery
    from dyntc.protocol.data.datasets import load

    data = load(args.dataset)
    known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, args.kcr, args.seed)
    truth = dict(zip(data.train.texts, data.train.labels))
    n_new = len(set(data.train.labels)) - len(known)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, CPU {cpu_name()}; {args.dataset} KCR {args.kcr} "
          f"seed {args.seed}: {len(labelled[0])} labelled, {len(unlabelled)} unlabelled texts, {n_new} new intents")
    clf = DynamicClassifier(seed=args.seed).fit(*labelled)
    default = discovery.MODE_SETTINGS["default"]
    seen: dict = {}
    plain = clustering.seeded_kmeans

    def spied(points, known_points, known_y, n_known, n_new, **options):  # discover's points, as it clusters them
        seen.update(points=points, known=known_points, known_y=known_y, n_known=n_known)
        seen["result"] = plain(points, known_points, known_y, n_known, n_new, **options)
        return seen["result"]

    clustering.seeded_kmeans = spied
    searches = {"neither search": (False, False), "swap search": (True, False), "swap and split searches": (True, True)}
    for name, (swaps, splits) in searches.items():
        discovery.MODE_SETTINGS["default"] = {**default, "swaps": swaps, "splits": splits}
        try:
            found = clf.discover(unlabelled, n_new)
        finally:
            discovery.MODE_SETTINGS["default"] = default
        report = absorbed_report(truth, set(known), unlabelled, found.assignments)
        nmi, ari, acc = scores([truth[t] for t in unlabelled], [str(a) for a in found.assignments])
        print(f"{name}: new intents' texts in known labels "
              f"{100 * report['new_texts_in_known']:.1f} %, absorbed {len(report['absorbed'])} of "
              f"{report['new_intents']} ({', '.join(report['absorbed'])}); known texts in their label "
              f"{100 * report['known_texts_right']:.1f} %; unlabelled texts NMI / ARI / ACC "
              f"{nmi:.1f} / {ari:.1f} / {acc:.1f}; discover {found.seconds:.1f} s; objective "
              f"{seen['result'][2]:.5f}", flush=True)
    clustering.seeded_kmeans = plain
    owners = [name for name, support in clf.labels_.items() for _ in range(support.n_parts)]
    if len(owners) != len(set(owners)):
        raise SystemExit("a known label in parts: the true partition is not defined here")
    ids = {name: i for i, name in enumerate(owners)}
    for name in sorted(set(data.train.labels) - set(known)):
        ids[name] = len(ids)
    true_ids = np.array([ids[truth[t]] for t in unlabelled])
    both = np.concatenate([seen["points"], seen["known"]])
    centroids = clustering.unit(clustering.group_sums(np.concatenate([true_ids, seen["known_y"]]), both, len(ids)))
    assign, _, objective = clustering.lloyd(seen["points"], both, seen["known_y"], centroids)
    nmi, ari, acc = scores(true_ids.tolist(), assign.tolist())
    print(f"Lloyd's iterations from the true intents' centroids: NMI / ARI / ACC {nmi:.1f} / {ari:.1f} / {acc:.1f}; "
          f"objective {objective:.5f}", flush=True)


if __name__ == "__main__":
    main()
