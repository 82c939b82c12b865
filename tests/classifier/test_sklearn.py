"""DynamicClassifier as a scikit-learn classifier: the estimator API, meta-estimators (Pipeline,
cross_val_score, GridSearchCV, clone), labels of any hashable type, and scikit-learn's own
estimator checks.

scikit-learn's checks feed numeric matrices; a text classifier declares ``two_d_array=False``, for
which ``check_estimator`` runs no check at all. So the checks run on
``make_pipeline(FunctionTransformer(rows_as_texts), DynamicClassifier(encoder="hashing"))``: every
numeric row becomes a text of binned-feature words, and every check then exercises the classifier's
fit, predict, predict_proba, decision_function, classes_, score, pickling and error paths. The
checks about the estimator object itself (init, params, repr, tags, mixin order) run on the bare
class. The checks expected to fail are named, each with the reason, in EXPECTED_FAILURES (through the
pipeline) and OBJECT_EXPECTED_FAILURES (on the bare class).
"""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone, is_classifier
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils import estimator_checks as ec
from sklearn.utils.validation import check_is_fitted

from _toy import LABELS, TEXTS
from dyntc import DynamicClassifier, DyntcError, DyntcWarning

TOY_TEXTS = [t for label in LABELS for t in TEXTS[label]]
TOY_LABELS = [label for label in LABELS for _ in TEXTS[label]]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)  # sklearn's tiny data sets trip the hygiene warnings
        yield


def rows_as_texts(X):
    """A numeric row as words: each feature binned at two widths (``f3a-2 f3b-5``), so that rows close
    in feature space share words and the hashing encoder's prototypes separate sklearn's blobs."""
    X = np.asarray(X, dtype=float)
    return [" ".join(f"f{j}a{int(np.floor(v))} f{j}b{int(np.floor(v * 2))}" for j, v in enumerate(row))
            for row in X]


def text_pipeline(**params):
    # validate=True: the transformer checks the numeric input (NaN, sparse, feature count) as any
    # scikit-learn transformer does; the texts it makes are the classifier's input
    return make_pipeline(FunctionTransformer(rows_as_texts, validate=True), DynamicClassifier(encoder="hashing", **params))


# ---------------------------------------------------------------------------------------- the API


def test_it_is_a_scikit_learn_classifier_with_text_input_tags():
    clf = DynamicClassifier(encoder="hashing")
    tags = clf.__sklearn_tags__()
    assert is_classifier(clf) and tags.estimator_type == "classifier"
    assert tags.input_tags.string and not tags.input_tags.two_d_array
    assert tags.target_tags.required
    with pytest.raises(SklearnNotFittedError):
        check_is_fitted(clf)
    clf.fit(TOY_TEXTS, TOY_LABELS)
    check_is_fitted(clf)  # no error


def test_clone_is_exact_and_unfitted():
    clf = DynamicClassifier(encoder="hashing", head=None, head_options={"tau": 0.1}, n_support=3).fit(
        TOY_TEXTS, TOY_LABELS)
    twin = clone(clf)
    assert twin.get_params() == clf.get_params() and twin.head_options is not clf.head_options
    assert " ".join(repr(twin).split()) == ("DynamicClassifier(encoder='hashing', head=None, head_options={'tau': 0.1}, "
                                            "n_support=3)")
    with pytest.raises(SklearnNotFittedError):
        check_is_fitted(twin)


def test_predict_returns_an_array_of_classes_and_classes_is_an_array():
    clf = DynamicClassifier(encoder="hashing").fit(np.array(TOY_TEXTS), np.array(TOY_LABELS))
    pred = clf.predict(["wake me up at six", "what is my balance"])
    assert isinstance(pred, np.ndarray) and pred.tolist() == ["alarm", "balance"]
    assert isinstance(clf.classes_, np.ndarray) and clf.classes_.tolist() == LABELS
    assert clf.predict_proba(["wake me up at six"]).shape == (1, 4)
    assert clf.score(TOY_TEXTS, TOY_LABELS) == pytest.approx(np.mean(clf.predict(TOY_TEXTS) == np.array(TOY_LABELS)))


@pytest.mark.parametrize("make", [
    lambda y: LABELS.index(y) * 7,  # python int
    lambda y: np.int64(LABELS.index(y) + 1),  # numpy int
    lambda y: (y, len(y)),  # tuple
    lambda y: LABELS.index(y) % 2 == 0 and y != "timer",  # bool: two classes
])
def test_any_hashable_label_round_trips_with_its_type(make, tmp_path):
    labels = [make(y) for y in TOY_LABELS]
    clf = DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, labels)
    assert list(clf.classes_) == sorted(set(labels))  # sorted as np.unique sorts them (7 before 14, not "14" < "7")
    pred = clf.predict(TOY_TEXTS)
    if isinstance(labels[0], tuple):
        assert pred.dtype == object and all(isinstance(p, tuple) for p in pred)
    else:
        assert pred.dtype.kind == np.asarray(labels).dtype.kind  # ints stay ints, bools bools
    assert np.mean([p == y for p, y in zip(pred, labels)]) > 0.9
    assert clf.label_scores(TOY_TEXTS).argmax(1).tolist() == [list(clf.classes_).index(p) for p in pred]
    clf.save(tmp_path / "m")
    again = DynamicClassifier.load(tmp_path / "m")
    assert list(again.classes_) == list(clf.classes_) and list(again.predict(TOY_TEXTS)) == list(pred)


def test_int_labels_sort_numerically_and_label_operations_take_them():
    labels = [{"alarm": 2, "balance": 10, "timer": 9, "weather": 100}[y] for y in TOY_LABELS]
    clf = DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, labels)
    assert clf.classes_.tolist() == [2, 9, 10, 100]
    proba = clf.predict_proba(["set a timer for ten minutes"])
    assert clf.classes_[proba.argmax()] == 9 == clf.predict(["set a timer for ten minutes"])[0]
    assert clf.add_label(11, ["turn on the lights", "lights on please", "switch the lamp on"]) == [2, 9, 10, 11, 100]
    assert clf.predict(["lights on please now"])[0] == 11
    assert clf.rename_label("11", 12) == [2, 9, 10, 12, 100]  # a stored name (as the CLI passes) works too
    with pytest.raises(DyntcError, match="labels are integers"):
        clf.add_label("lights", ["x y"])
    assert clf.rank(["set a timer for ten minutes"], k=2)[0][0][0] == 9


def test_bad_targets_are_clear_errors():
    with pytest.raises(DyntcError, match="mix int and str"):
        DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, [1] + TOY_LABELS[1:])
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, np.linspace(0, 1, len(TOY_TEXTS)))
    with pytest.raises(DyntcError, match="texts is a table of 2 columns|one text per sample"):
        DynamicClassifier(encoder="hashing").fit(np.array([TOY_TEXTS, TOY_TEXTS]).T, TOY_LABELS)


# ---------------------------------------------------------------------------------------- meta-estimators


def test_pipeline_cross_val_score_and_grid_search():
    texts, labels = np.array(TOY_TEXTS), np.array(TOY_LABELS)
    pipe = make_pipeline(FunctionTransformer(lambda x: [t.lower() for t in x]), DynamicClassifier(encoder="hashing"))
    scores = cross_val_score(pipe, texts, labels, cv=4)
    assert scores.shape == (4,) and scores.mean() > 0.7
    grid = GridSearchCV(DynamicClassifier(encoder="hashing"), {"head": [None, "cosine"], "debias": [True, False]},
                        cv=3, scoring="neg_log_loss").fit(texts, labels)
    assert set(grid.best_params_) == {"head", "debias"} and np.isfinite(grid.best_score_)
    assert grid.predict(["wake me up at six"]).tolist() == ["alarm"]


# ---------------------------------------------------------------------------------------- scikit-learn's checks

# Checks expected to fail, each with the reason. Through the pipeline:
EXPECTED_FAILURES = {
    # These two hash a Pipeline's `steps`, whose fitted estimators change by design: any Pipeline
    # fails them (LogisticRegression's too). What they check of the classifier itself, that fit
    # changes no parameter and sets only trailing-underscore attributes, is tested on texts below.
    "check_estimators_overwrite_params": "fails for every Pipeline",
    "check_dont_overwrite_parameters": "fails for every Pipeline",
    # The network runs in float32: a text's scores (16 cos) in a batch and alone differ by up to
    # ~1e-6, above this check's atol of 1e-7. Predictions are identical and scores agree to 1e-5
    # (test_batches_and_single_texts_agree below).
    "check_methods_subset_invariance": "float32 scores differ by ~1e-6 between a batch and one text",
}
# On the bare class: the product fails loudly, so a bad value given to set_params is refused at once
# (scikit-learn's own estimators wait for fit); a service calling set_params must never hold a bad
# value. (check_fit_score_takes_y passes through the pipeline; the classifier's own fit and score
# name their arguments texts and labels, and take them positionally as meta-estimators pass them.)
OBJECT_EXPECTED_FAILURES = {"check_do_not_raise_errors_in_init_or_set_params": "set_params validates at once"}

# Checks of the estimator object itself: they take no data, so they run on the bare class.
OBJECT_CHECKS = [ec.check_no_attributes_set_in_init, ec.check_parameters_default_constructible,
                 ec.check_estimator_repr, ec.check_estimator_cloneable, ec.check_valid_tag_types,
                 ec.check_estimator_tags_renamed, ec.check_mixin_order, ec.check_get_params_invariance,
                 ec.check_set_params, ec.check_do_not_raise_errors_in_init_or_set_params]


@pytest.mark.parametrize("check", OBJECT_CHECKS, ids=lambda c: c.__name__)
def test_object_checks_on_the_bare_class(check):
    if check.__name__ in OBJECT_EXPECTED_FAILURES:
        with pytest.raises(DyntcError, match=r"^\w+ must be .*, got "):  # the parameter's own message, nothing else
            check("DynamicClassifier", DynamicClassifier(encoder="hashing"))
        return
    check("DynamicClassifier", DynamicClassifier(encoder="hashing"))


@ec.parametrize_with_checks([text_pipeline()], expected_failed_checks=lambda est: EXPECTED_FAILURES)
def test_scikit_learn_checks_through_a_text_pipeline(estimator, check):
    check(estimator)


def test_the_checks_really_run_the_classifier():
    """The check suite above is not empty: it reaches the classifier's own methods."""
    checks = list(ec._yield_all_checks(text_pipeline(), legacy=True))
    names = {getattr(c, "func", c).__name__ for c in checks}
    assert {"check_classifiers_train", "check_classifiers_classes", "check_estimators_pickle",
            "check_decision_proba_consistency", "check_supervised_y_2d"} <= names
    assert not list(ec._yield_all_checks(DynamicClassifier(encoder="hashing"), legacy=True))  # why the pipeline


def test_fit_changes_no_parameter_and_sets_only_underscore_attributes():
    import joblib

    clf = DynamicClassifier(encoder="hashing", head_options={"tau": 0.1}, encoder_options={})
    params = {k: joblib.hash(v) for k, v in clf.get_params().items()}
    public = set(vars(clf))
    clf.fit(TOY_TEXTS, TOY_LABELS)
    assert {k: joblib.hash(v) for k, v in clf.get_params().items()} == params
    added = set(vars(clf)) - public
    assert added and all(a.startswith("_") or a.endswith("_") for a in added), added


def test_batches_and_single_texts_agree():
    clf = DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, TOY_LABELS)
    queries = ["wake me up at six", "how much is left", "rain at the weekend", "pasta timer please"]
    alone = np.concatenate([clf.decision_function([q]) for q in queries])
    np.testing.assert_allclose(clf.decision_function(queries), alone, rtol=0, atol=1e-5)
    assert clf.predict(queries).tolist() == [clf.predict([q])[0] for q in queries]


def test_a_fitted_classifier_pickles_and_predicts_alike():
    clf = DynamicClassifier(encoder="hashing").fit(TOY_TEXTS, TOY_LABELS)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_allclose(again.predict_proba(TOY_TEXTS), clf.predict_proba(TOY_TEXTS))
