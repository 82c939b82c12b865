"""DynamicClassifier on a real sample of CLINC150, with what needs a trained encoder: SRU training
(hyperbolic and Euclidean), fine_tune, the SRU vocabulary's growth from GloVe, the MiniLM backbone
end to end (train="none", "backbone", hard-negative episodes, CUDA).

The estimator's and the label operations' behaviour without a trained network (parameters, fit's
input checks, every label operation, prediction, persistence, bad input) is tested on the hashing
toy in test_estimator.py and test_label_operations.py."""

import copy

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError

pytestmark = pytest.mark.data  # every test runs on a CLINC150 sample

OLD = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather"]
NEW = ["translate", "flip_coin"]
SMALL = dict(encoder="sru", metric="hyperbolic", hidden_size=64, num_layers=1, dropout=0.1, max_len=32, episodes=30, lr=3e-3)


@pytest.fixture(scope="module")
def clinc(clinc_raw):
    raw = clinc_raw
    keep = set(OLD + NEW)

    def split(key):
        out = {}
        for text, label in raw[key]:
            if label in keep:
                out.setdefault(label, []).append(text)
        return out

    return {"train": split("train"), "dev": split("val"), "test": split("test")}


def _flat(groups, labels):
    texts = [t for y in labels for t in groups[y]]
    return texts, [y for y in labels for _ in groups[y]]


@pytest.fixture(scope="module")
def fitted(clinc):
    texts, labels = _flat(clinc["train"], OLD)
    return DynamicClassifier(**SMALL).fit(texts, labels, dev=_flat(clinc["dev"], OLD))


@pytest.fixture
def clf(fitted):
    """A private copy of the fitted classifier, free to change."""
    return copy.deepcopy(fitted)


def _acc(clf, groups, label, expect=None):
    pred = clf.predict(groups[label]).tolist()
    return float(np.mean([p == (expect or label) for p in pred]))


# ------------------------------------------------------------------------------- SRU training


def test_fit_and_fine_tune_featurize_each_text_once(clinc, monkeypatch):
    """The episodes and the prototypes share one featurization (costly for pretrained backbones)."""
    from dyntc.core.encoders.glove_sru import GloveSRUEncoder

    seen: list[int] = []
    original = GloveSRUEncoder.featurize
    monkeypatch.setattr(GloveSRUEncoder, "featurize", lambda self, texts: seen.append(len(texts)) or original(self, texts))
    texts, labels = _flat(clinc["train"], OLD[:3])
    clf = DynamicClassifier(**{**SMALL, "episodes": 3}).fit(texts, labels)
    assert sum(seen) == len(texts)
    seen.clear()
    clf.fine_tune(episodes=2)
    assert sum(seen) == len(texts)


def test_fit_learns_and_predicts(fitted, clinc):
    assert list(fitted.classes_) == sorted(OLD)
    assert fitted.support_counts() == {y: len(clinc["train"][y]) for y in sorted(OLD)}
    texts, labels = _flat(clinc["test"], OLD)
    assert fitted.score(texts, labels) > 0.7  # chance: 1/6
    assert fitted.train_result_.best_dev_acc is not None


def test_euclidean_fit(clinc):
    texts, labels = _flat(clinc["train"], OLD[:3])
    clf = DynamicClassifier(**{**SMALL, "metric": "euclidean", "episodes": 10}).fit(texts, labels)
    assert clf.encode(["hello"]).shape == (1, 64)
    assert set(clf.predict(clinc["test"]["alarm"]).tolist()) <= set(OLD[:3])


# ------------------------------------------------------------------------------- vocabulary and fine_tune


def test_extend_vocab_gives_new_words_their_glove_vectors(clf):
    vocab = clf.model_.encoder.vocab
    assert "zeppelin" not in vocab.index
    clf.add_label("airship", ["book a zeppelin ride", "zeppelin tickets please"])
    assert "zeppelin" in clf.model_.encoder.vocab.index
    row = clf.model_.encoder.embedding.weight[clf.model_.encoder.vocab.index["zeppelin"]]
    assert row.abs().sum() > 0
    off = copy.deepcopy(clf).set_params(extend_vocab=False)
    n = len(off.model_.encoder.vocab)
    off.add_label("blimp", ["a qwzxv blimp", "blimp"])
    assert len(off.model_.encoder.vocab) == n


def test_fine_tune_re_embeds_and_rebuilds(clf, clinc):
    clf.add_label("translate", clinc["train"]["translate"][:5])
    weights = {k: v.clone() for k, v in clf.model_.state_dict().items()}
    texts = clinc["train"]["translate"][5:10] + clinc["train"]["weather"][:5]
    clf.fine_tune(texts, ["translate"] * 5 + ["weather"] * 5, episodes=5)
    assert any(not torch.equal(weights[k], v) for k, v in clf.model_.state_dict().items())
    assert len(clf.support("translate")) == 10
    # Stored points and prototypes now come from the fine-tuned encoder.
    for c in ("translate", "alarm"):
        assert torch.allclose(clf.labels_.support(c).points, clf.space_.embed(clf.support(c)), atol=1e-5)
    alarm = clf.space_.means([clf.labels_.support("alarm").points])[0]
    assert torch.allclose(clf.labels_._prototypes["alarm"], alarm, atol=1e-6)


def test_fine_tune_keeps_a_merged_labels_parts(clf):
    """A merged label keeps one prototype per part (test_label_operations.py), also after fine_tune
    re-embeds its examples: each part's prototype is rebuilt from that part's new points."""
    clf.set_params(head=None)
    clf.merge_labels(["alarm", "timer"], into="clock")
    parts = clf.labels_.support("clock").stored_parts()
    clf.fine_tune(episodes=2)
    support = clf.labels_.support("clock")
    assert support.n_parts == 2 and support.stored_parts() == parts
    ids = support.part_ids()
    expected = clf.space_.means([support.points[ids == 0], support.points[ids == 1]])
    assert torch.allclose(clf.labels_._prototypes["clock"], expected, atol=1e-6)


def test_fine_tune_on_unknown_labels_changes_nothing(clf):
    before = dict(clf.labels_.items())
    changed, log = set(clf.labels_.changed), list(clf.labels_.log)
    with pytest.raises(DyntcError, match="add them with add_label first"):
        clf.fine_tune(["hello"], ["nope"])
    assert list(clf.classes_) == sorted(OLD)
    assert dict(clf.labels_.items()) == before  # the very same (immutable) support sets
    assert clf.labels_.changed == changed and clf.labels_.log == log


def test_fine_tune_checks_dev_and_lr_like_fit(fitted):
    clf = copy.deepcopy(fitted)
    vocab, counts = len(clf.model_.encoder.vocab), clf.support_counts()
    with pytest.raises(DyntcError, match="dev must be a pair"):  # checked before the new words join
        clf.fine_tune(["set an alarm for quixotic zyzzyva"], ["alarm"], episodes=1, dev=(["hi"],))
    assert len(clf.model_.encoder.vocab) == vocab and clf.support_counts() == counts
    for bad in (0, True, 1.5):
        with pytest.raises(DyntcError, match="episodes must be an integer"):
            clf.fine_tune(episodes=bad)
    with pytest.raises(DyntcError, match="not among the labels trained on"):
        clf.fine_tune(episodes=1, dev=(["hi"], ["no-such-label"]))
    for bad in (0, -1e-3, "fast", True):
        with pytest.raises(DyntcError, match="lr must be a number > 0"):
            clf.fine_tune(episodes=1, lr=bad)


# ------------------------------------------------------------------------------- the MiniLM backbone


def test_default_classifier_is_minilm_euclidean_end_to_end(clinc, tmp_path):
    """The defaults a user gets: the pretrained MiniLM backbone and the Euclidean metric."""
    pytest.importorskip("sentence_transformers")
    clf = DynamicClassifier(episodes=20, eval_every=10)
    assert (clf.encoder, clf.metric, clf.head) == ("minilm", "euclidean", "cosine")
    texts, labels = _flat({y: v[:30] for y, v in clinc["train"].items()}, OLD)
    clf.fit(texts, labels)
    assert clf.model_.encoder.config()["kind"] == "pretrained" and clf.model_.metric == "euclidean"
    clf.add_label("flip_coin", clinc["train"]["flip_coin"][:5])
    assert _acc(clf, clinc["test"], "flip_coin") > 0.6 and _acc(clf, clinc["test"], "alarm") > 0.6
    clf.refresh()  # what the background refresh does a second later; a loaded classifier does it at once
    back = DynamicClassifier.load(clf.save(tmp_path / "m"))
    test, _ = _flat(clinc["test"], OLD + ["flip_coin"])
    np.testing.assert_array_equal(back.predict_proba(test[:40]), clf.predict_proba(test[:40]))


def test_train_none_embeds_only(clinc):
    """train='none' (the pretrained default): the backbone's own embeddings, no head, no training;
    a one-example label is fine (no episodes need it) and fine_tune says there is nothing to train."""
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:10] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier().fit(texts + ["what time is it in tokyo"], labels + ["time_zone"])
    assert clf.train_result_ is None and list(clf.model_.parameters()) == []
    assert clf.space_.dim == 384
    np.testing.assert_allclose(np.linalg.norm(clf.encode(texts[:5]), axis=1), 1.0, rtol=1e-5)  # MiniLM's Normalize
    with pytest.raises(DyntcError, match="nothing to train"):
        clf.fine_tune(episodes=2)


def test_train_backbone_trains_only_the_top_layers(clinc):
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:8] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=3, n_support=2, n_query=12, eval_every=3)
    clf.fit(texts, labels)
    model = clf.model_
    assert clf.train_result_.steps == 3 and model.learn_scale
    encoder = model.encoder
    layers = encoder.backbone[0].auto_model.encoder.layer
    trained = [any(p.requires_grad for p in block.parameters()) for block in layers]
    assert trained == [False] * (len(layers) - 2) + [True, True]
    from dyntc.core.encoders.pretrained import load_sentence_transformer, resolve_backbone

    before = dict(load_sentence_transformer(resolve_backbone("minilm")).named_parameters())
    after = dict(encoder.backbone.named_parameters())
    bottom = next(n for n in after if ".layer.0." in n)
    top = next(n for n in after if f".layer.{len(layers) - 1}." in n and n.endswith("weight"))
    torch.testing.assert_close(after[bottom], before[bottom])
    assert not torch.equal(after[top], before[top])


def test_backbone_with_hard_negative_episodes(clinc):
    """hard_fraction reaches the episode sampler: with more labels than max_classes the training
    episodes' predictions are recorded as confusability (and the sampler draws partners from it)."""
    pytest.importorskip("sentence_transformers")
    from dyntc.core import episodes

    seen = []
    original = episodes.EpisodeSampler.record

    def spy(self, episode, probs):
        seen.append((self.hard_fraction, episode.n_classes))
        return original(self, episode, probs)

    texts, labels = _flat({y: v[:6] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=2, n_support=2, n_query=8, max_classes=3, hard_fraction=0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(episodes.EpisodeSampler, "record", spy)
        clf.fit(texts, labels)
    assert seen == [(0.5, 3), (0.5, 3)] and len(set(labels)) > 3
    assert clf.train_result_.steps == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_backbone_on_cuda(clinc):
    """The same backbone fine-tuning on a GPU: trains, predicts, and matches the CPU embedding of
    the trained weights."""
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:8] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=5, n_support=2, n_query=12, hard_fraction=0.5,
                            max_classes=3, device="cuda").fit(texts, labels)
    assert clf.train_result_.steps == 5
    on_gpu = clf.encode(texts[:16])
    pred = clf.predict(texts[:16]).tolist()
    clf.set_params(device="cpu")
    np.testing.assert_allclose(clf.encode(texts[:16]), on_gpu, atol=1e-4)
    assert clf.predict(texts[:16]).tolist() == pred


