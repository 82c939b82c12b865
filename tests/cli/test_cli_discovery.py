"""`dyntc discover | suggest` on the hashing-encoder toy model (tests/_toy.py), in-process."""

import json

import pytest

from _cli import run_cli
from dyntc import DynamicClassifier
from dyntc.classifier.discovery import WORDS_WEIGHT
from tests._toy import toy_classifier
from tests.classifier.test_discovery import KNOWN, MUSIC, TRANSLATE


cli = run_cli


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    toy_classifier(head=None).save(path)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(MUSIC + TRANSLATE + list(KNOWN.values()) + [MUSIC[0]]) + "\n")
    return path, texts


def test_discover_human_json_and_no_write(model):
    path, texts = model
    versions = len(DynamicClassifier.versions(path))
    code, out, err = cli("discover", path, "--data", texts, "--n-new", "2")
    assert code == 0, err
    assert "1 repeated texts" in err
    assert "16 texts: 4 in existing labels, 12 in 2 new clusters, 0 noise (n_new 2 given" in out
    assert "[1] " in out and "[2] " in out and "--accept all" in out
    code, out, _ = cli("discover", path, "--data", texts, "--n-new", "2", "--json")
    d = json.loads(out)
    assert d["accepted"] is None and len(d["clusters"]) == 2 and d["counts"]["new"] == 12
    assert d["settings"]["words_weight"] == WORDS_WEIGHT > 0
    code, out, _ = cli("discover", path, "--data", texts, "--n-new", "2", "--words-weight", "0", "--json")
    assert code == 0 and json.loads(out)["settings"]["words_weight"] == 0
    assert len(DynamicClassifier.versions(path)) == versions  # nothing written without --accept


def test_discover_accept_writes_one_version(model):
    path, texts = model
    versions = len(DynamicClassifier.versions(path))
    code, out, err = cli("discover", path, "--data", texts, "--n-new", "2", "--accept", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert len(d["accepted"]) == 1 and d["accepted"][0] == d["clusters"][1]["name"]
    assert len(DynamicClassifier.versions(path)) == versions + 1
    assert d["accepted"][0] in DynamicClassifier.load(path).classes_


@pytest.mark.parametrize("args, message", [
    (["--n-new", "0"], "n_new must be an integer between 1 and 5"),
    (["--n-new", "2", "--accept", "3"], "cluster numbers run from 1 to 2"),
    (["--n-new", "2", "--accept", "x"], "--accept takes 'all' or cluster numbers"),
    (["--mode", "slow"], "mode must be one of default, fast"),
    (["--words-weight", "-1"], "words_weight must be a number from 0"),
    (["--adapt-s", "0"], "adapt_s must be a finite number of seconds > 0"),
    (["--n-new", "2", "--adapt-s", "5", "--accept", "all"], "adapt_s fine-tunes a pretrained backbone"),
])
def test_discover_errors(model, args, message):
    path, texts = model
    versions = len(DynamicClassifier.versions(path))
    code, _, err = cli("discover", path, "--data", texts, *args)
    assert code == 2 and message in err
    assert len(DynamicClassifier.versions(path)) == versions


def test_discover_missing_file(model, tmp_path):
    code, _, err = cli("discover", model[0], "--data", tmp_path / "none.txt")
    assert code == 2 and "does not exist" in err


def test_suggest(tmp_path):
    groups = {"music_a": MUSIC[0::2], "music_b": MUSIC[1::2], "alarm": ["set an alarm", "wake me up at six",
                                                                      "alarm for seven", "set my alarm clock"]}
    path = tmp_path / "model"
    DynamicClassifier(encoder="hashing", head=None).fit(
        [t for g in groups.values() for t in g], [n for n, g in groups.items() for _ in g]).save(path)
    code, out, err = cli("suggest", path)
    assert code == 0, err
    assert "merge 'music_a' + 'music_b'" in out
    code, out, _ = cli("suggest", path, "--json", "--top", "1")
    s = json.loads(out)["suggestions"]
    assert len(s) == 1 and s[0]["kind"] == "merge" and sorted(s[0]["labels"]) == ["music_a", "music_b"]
    code, _, err = cli("suggest", path, "--merge-rate", "3")
    assert code == 2 and "merge_rate must be a number in (0, 1.0]" in err
