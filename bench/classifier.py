"""`DynamicClassifier` latency and throughput against the bare backbone it runs (the targets:
``add_label`` with 5 examples <= 50 ms, prediction >= 500 texts/s with MiniLM on 2 cores).

    python -m bench.classifier [--threads 2] [--labels 20] [--predict-texts 2000]

Fits ``DynamicClassifier()`` (frozen all-MiniLM-L6-v2, no head, Euclidean, support-size correction)
on CLINC150's training split (150 intents, ``--fit-per-label`` texts each; fit time printed, not the
point), then times:

* ``add_label`` of ``--labels`` new labels with 5 examples each, texts never embedded before (taken
  from the test split; the on-disk embedding cache is off), median and max; peer: the same backbone's
  ``SentenceTransformer.encode`` of those 5 texts plus their mean, the least any implementation on
  this backbone has to do.
* ``predict`` of ``--predict-texts`` texts never embedded before, texts per second; peer:
  ``encode`` in batches of 256 plus the nearest centroid in numpy. Also with the backbone run by ONNX
  Runtime (``encoder_options={"runtime": "onnx"}`` and ``"onnx-int8"``, ``--runtimes``), each against
  the same peer, with the cosine of its embeddings to PyTorch's and the share of equal predictions.

Prints the CPU and load average with every figure, and the ratios to the peer measured in this run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["DYNTC_CACHE"] = "off"  # every text is new to the classifier, as in production

import torch  # noqa: E402

from bench._machine import cpu_model, load_average  # noqa: E402
from dyntc import DynamicClassifier  # noqa: E402
from dyntc.protocol.data.datasets import load  # noqa: E402
from dyntc.core.encoders.pretrained import load_sentence_transformer, resolve_backbone  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--labels", type=int, default=20)
    ap.add_argument("--predict-texts", type=int, default=2000)
    ap.add_argument("--fit-per-label", type=int, default=100)
    ap.add_argument("--runtimes", default="torch,onnx,onnx-int8", help="backbone runtimes to time predict with")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load("clinc150")
    print(f"CPU: {cpu_model()}, torch threads {args.threads}, load average {load_average()}")

    seen: dict[str, int] = {}
    fit_texts, fit_labels = [], []
    for text, label in zip(data.train.texts, data.train.labels):
        if seen.get(label, 0) < args.fit_per_label:
            seen[label] = seen.get(label, 0) + 1
            fit_texts.append(text)
            fit_labels.append(label)
    t0 = time.perf_counter()
    clf = DynamicClassifier().fit(fit_texts, fit_labels)
    print(f"fit on {len(fit_texts)} texts, {clf.n_classes_} labels: {time.perf_counter() - t0:.1f} s (embedding them)")

    by_label: dict[str, list[str]] = {}
    for text, label in zip(data.test.texts, data.test.labels):
        by_label.setdefault(label, []).append(text)
    groups = [texts[:5] for _, texts in sorted(by_label.items())[: args.labels]]
    used = {t for g in groups for t in g}
    predict_texts = [t for t in data.test.texts if t not in used][: args.predict_texts]

    st = load_sentence_transformer(resolve_backbone("minilm"))
    st.max_seq_length = clf.max_len
    st.encode(["warm up"])
    clf.add_label("warm-up label", ["warm up the classifier"])
    peer_ms, ours_ms = [], []
    for g in groups:  # the peer first: it has no cache, ours then sees the texts for the first time too
        t0 = time.perf_counter()
        st.encode(g, batch_size=256, convert_to_numpy=True).mean(0)
        peer_ms.append(1000 * (time.perf_counter() - t0))
    for i, g in enumerate(groups):
        t0 = time.perf_counter()
        clf.add_label(f"new label {i}", g)
        ours_ms.append(1000 * (time.perf_counter() - t0))
    med, peer_med = statistics.median(ours_ms), statistics.median(peer_ms)
    print(f"add_label, 5 new texts ({len(groups)} labels): median {med:.1f} ms, max {max(ours_ms):.1f} ms; "
          f"peer encode + mean: median {peer_med:.1f} ms; ratio {med / peer_med:.2f} (load {load_average()})")

    centroids = clf.labels_.prototypes().numpy()
    n = len(predict_texts)
    reference = None
    for runtime in [r for r in args.runtimes.split(",") if r]:
        # fitted alike (clf above also holds the added labels); torch's embeddings come from the memory cache
        model = DynamicClassifier(encoder_options={"runtime": runtime}).fit(fit_texts, fit_labels)
        model.predict(["warm up the runtime"])
        t0 = time.perf_counter()  # the peer right before each of ours: the same machine state
        x = st.encode(predict_texts, batch_size=256, convert_to_numpy=True)
        ((x[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
        peer_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = model.predict(predict_texts)
        ours_s = time.perf_counter() - t0
        fidelity = ""
        if runtime == "torch":
            reference = (pred, x)
        elif reference is not None:
            e = model.encode(predict_texts)
            cos = (e * reference[1]).sum(1)
            same = sum(a == b for a, b in zip(pred, reference[0])) / n
            fidelity = f"; vs torch: cosine min {cos.min():.4f} mean {cos.mean():.4f}, same prediction {100 * same:.1f}%"
        print(f"predict {n} new texts, runtime {runtime}: {n / ours_s:.0f} texts/s; peer encode + nearest centroid: "
              f"{n / peer_s:.0f} texts/s; ratio {peer_s / ours_s:.2f} of the peer's speed{fidelity} (load {load_average()})",
              flush=True)


if __name__ == "__main__":
    main()
