"""What the library says about input it accepts but that is probably not meant: DyntcWarning for
duplicate and conflicting examples, labels of few examples, examples a split drops, calibrations
that cannot be trusted; refresh() that is synchronous; the per-label confidence ranking; the OpenMP
wait policy a library process gets."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from _toy import LABELS, TEXTS, toy_classifier
from dyntc import DynamicClassifier, DyntcError, DyntcWarning
from dyntc.classifier.hygiene import MIN_EXAMPLES

ALL_TEXTS = [t for label in LABELS for t in TEXTS[label]]
ALL_LABELS = [label for label in LABELS for _ in TEXTS[label]]


def _messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DyntcWarning)]


def test_clean_data_fits_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DyntcWarning)
        toy_classifier()


def test_fit_warns_about_duplicates_conflicts_and_small_labels():
    texts = ALL_TEXTS + ["wake me up at six", "Wake me up at SIX ", "what is my balance", "lonely text"]
    labels = ALL_LABELS + ["alarm", "alarm", "timer", "solo"]
    with pytest.warns(DyntcWarning) as record:
        DynamicClassifier(encoder="hashing").fit(texts, labels)
    messages = _messages(record)
    assert any("2 duplicate (text, label) pairs" in m and "drop the duplicates" in m for m in messages), messages
    assert any("1 texts appear under two or more labels" in m and "'balance'" in m and "'timer'" in m
               for m in messages), messages
    assert any(f"1 labels have fewer than {MIN_EXAMPLES} examples ('solo')" in m for m in messages), messages
    assert all(w.filename == __file__ for w in record)  # the warning points at the user's line


def test_add_label_and_add_examples_warn_and_still_apply():
    clf = toy_classifier()
    with pytest.warns(DyntcWarning) as record:
        clf.add_label("clock", ["set an alarm for 7 am", "what time is it", "what time is it"])
    messages = _messages(record)
    assert any("already examples of another label" in m and "'alarm'" in m for m in messages), messages
    assert any("already among its examples or repeated" in m for m in messages), messages
    assert any("2 distinct examples, fewer than" in m for m in messages), messages
    assert "clock" in clf.classes_ and len(clf.support("clock")) == 3  # a warning, not a refusal
    with pytest.warns(DyntcWarning, match="already among its examples"):
        clf.add_examples("weather", ["will it rain tomorrow"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DyntcWarning)
        clf.add_examples("weather", ["is there a storm coming"])  # new and clean: silent


def test_split_label_says_what_it_drops_unless_reassigned():
    clf = toy_classifier()
    parts = {"alarm": TEXTS["alarm"][:2], "early_alarm": ["wake me before dawn", "alarm at 5 am"]}
    with pytest.warns(DyntcWarning, match=r"split_label dropped 8 of the 10 stored examples of 'alarm'.*reassign=True"):
        clf.copy().split_label("alarm", parts)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DyntcWarning)
        kept = clf.copy()
        kept.split_label("alarm", parts, reassign=True)
    # the 8 old examples not given again join the nearest new label; the 2 given again are not doubled
    assert sum(kept.support_counts()[n] for n in ("alarm", "early_alarm")) == 2 + 2 + 8


def test_refresh_is_synchronous():
    clf = toy_classifier()
    clf.add_label("lights", ["turn on the lights", "lights off please", "dim the lamp"])
    assert clf.head_status()["refreshing"]  # scheduled by the label operation
    info = clf.refresh()
    status = clf.head_status()
    assert status["refreshing"] is False and status["imprinted"] == [] and info["examples"] == len(ALL_TEXTS) + 3


# ---------------------------------------------------------------------------------------- calibration


def test_a_perfect_held_out_set_keeps_the_prior_temperature_with_a_warning():
    clf = toy_classifier()
    with pytest.warns(DyntcWarning, match="every one of the .* held-out texts is classified correctly"):
        clf.calibrate(ALL_TEXTS[::2], ALL_LABELS[::2])
    cal = clf.calibration_
    assert cal.accuracy == 1.0 and not cal.temperature_fitted and cal.temperature == clf.prior_temperature_
    assert clf.predict_proba(["wake me up at six"]).max() < 0.9999  # no collapse to 1.0


def test_a_small_held_out_set_is_warned_about_and_ece_after_is_out_of_sample():
    clf = toy_classifier()
    texts = ["wake me at 7", "how much money", "timer 10 minutes", "rain later", "alarm please",
             "forecast tomorrow", "my account", "timer for eggs", "is it sunny", "balance please"]
    labels = ["alarm", "balance", "timer", "weather", "timer", "weather", "balance", "alarm", "weather", "balance"]
    with pytest.warns(DyntcWarning, match="calibrating on 10 held-out texts"):
        clf.calibrate(texts, labels)
    cal = clf.calibration_
    assert cal.temperature_fitted and cal.ece_after_in_sample is not None
    assert cal.ece_after != cal.ece_after_in_sample  # measured out of sample, not on the texts T was fitted on
    with pytest.raises(DyntcError, match="at least 2 held-out texts"):
        clf.calibrate(texts[:1], labels[:1])


def test_cross_fitted_proba_uses_the_other_folds():
    import torch
    from dyntc.classifier.calibration import cross_fitted_proba, fit_temperature

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(40, 3, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 3, (40,), generator=gen)
    proba = cross_fitted_proba(logits, labels, 1.0, folds=40)  # leave-one-out
    t = fit_temperature(-logits[1:], labels[1:])
    np.testing.assert_allclose(proba[0].numpy(), torch.softmax(logits[0] / t, 0).numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------------------- ranking


def test_rank_is_predict_proba_sorted_and_records_carry_it():
    clf = toy_classifier()
    texts = ["wake me up at six", "will it rain"]
    proba = clf.predict_proba(texts)
    ranked = clf.rank(texts, k=3)
    for row, p in zip(ranked, proba):
        assert [label for label, _ in row] == [clf.classes_[j] for j in np.argsort(-p)[:3]]
        np.testing.assert_allclose([c for _, c in row], np.sort(p)[::-1][:3])
    assert len(clf.rank(texts, k=None)[0]) == len(LABELS)
    records = clf.prediction_records(clf.label_scores(texts), ranking=2)
    assert [r["ranking"][0]["label"] for r in records] == clf.predict(texts).tolist()
    assert records[0]["ranking"][0]["confidence"] == round(float(proba[0].max()), 6) and "probability" not in records[0]
    with pytest.raises(DyntcError, match="ranking must be an integer >= 0"):
        clf.prediction_records(clf.label_scores(texts), ranking=-1)


def test_a_two_label_classifier_has_a_1d_decision_function_and_full_label_scores():
    texts = TEXTS["alarm"] + TEXTS["weather"]
    clf = DynamicClassifier(encoder="hashing").fit(texts, ["alarm"] * 10 + ["weather"] * 10)
    decision, scores = clf.decision_function(texts), clf.label_scores(texts)
    assert decision.shape == (20,) and scores.shape == (20, 2)
    np.testing.assert_allclose(decision, scores[:, 1] - scores[:, 0])
    np.testing.assert_allclose(clf.proba_from_scores(decision), clf.predict_proba(texts))
    assert clf.classes_[(decision > 0).astype(int)].tolist() == clf.predict(texts).tolist()
    with pytest.raises(DyntcError, match="pass label_scores"):
        clf.prediction_records(decision)


# ---------------------------------------------------------------------------------------- threads


def _policy_after(code: str, env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", code + "\nimport os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_dyntc_before_torch_sets_the_passive_wait_policy():
    assert _policy_after("import dyntc", None) == "PASSIVE"
    assert _policy_after("import dyntc", "ACTIVE") == "ACTIVE"  # the user's choice wins
    assert _policy_after("import torch, dyntc", None) == "None"  # too late to matter: left alone
