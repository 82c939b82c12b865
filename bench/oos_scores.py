"""Which score tells CLINC150's out-of-scope texts apart best: the product's head, or nearest examples.

``DynamicClassifier()`` (frozen all-MiniLM-L6-v2, the cosine head) is fitted on all of CLINC150's
training texts; the in-scope test texts and the out-of-scope test texts are scored by

* the head: the best label's score (what ``predict(reject=True)`` thresholds), its softmax
  probability, and the log-sum-exp of the label scores (the "energy" score);
* the nearest training examples: mean cosine of the k nearest in the classifier's space (k = 1, 5, 10,
  25), and the cosine of the nearest label prototype (the mean of its examples);

and each score's AUROC (in-scope against out-of-scope) is printed.

    DYNTC_DATA=/path/to/datasets python -m bench.oos_scores
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def main() -> None:
    import torch
    from sklearn.metrics import roc_auc_score

    from bench._intents_data import load_data
    from bench.backbone import header
    from dyntc import DynamicClassifier

    header(SimpleNamespace(threads=torch.get_num_threads()))
    data = load_data("clinc150")
    clf = DynamicClassifier(seed=0).fit(data.train.texts, [int(y) for y in data.train.y])

    def auroc(s_in, s_out) -> float:
        return roc_auc_score(np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], np.r_[s_in, s_out])

    rows = []
    s_in, s_out = clf.label_scores(data.test.texts), clf.label_scores(data.oos_test.texts)
    rows.append(("head: best label's score (the product's)", auroc(s_in.max(1), s_out.max(1))))
    p_in, p_out = clf.predict_proba(data.test.texts), clf.predict_proba(data.oos_test.texts)
    rows.append(("head: best label's probability", auroc(p_in.max(1), p_out.max(1))))
    energy = lambda s: torch.logsumexp(torch.as_tensor(s), 1).numpy()  # noqa: E731
    rows.append(("head: log-sum-exp of the scores", auroc(energy(s_in), energy(s_out))))
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    train, x_in, x_out = (unit(clf.encode(t)) for t in (data.train.texts, data.test.texts, data.oos_test.texts))
    c_in, c_out = x_in @ train.T, x_out @ train.T
    for k in (1, 5, 10, 25):
        top = lambda c: np.sort(c, 1)[:, -k:].mean(1)  # noqa: E731
        rows.append((f"nearest training examples: mean cosine of {k}", auroc(top(c_in), top(c_out))))
    y = np.asarray(data.train.y)
    protos = unit(np.stack([train[y == c].mean(0) for c in np.unique(y)]))
    rows.append(("nearest label prototype: cosine", auroc((x_in @ protos.T).max(1), (x_out @ protos.T).max(1))))
    print(f"CLINC150: fitted on {len(data.train.texts)} training texts; test {len(data.test.texts)} in scope, "
          f"{len(data.oos_test.texts)} out of scope")
    print("| out-of-scope score | AUROC | against the product's |")
    print("|---|---:|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.4f} | {value - rows[0][1]:+.4f} |")


if __name__ == "__main__":
    main()
