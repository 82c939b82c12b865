"""A label set exported to CSV, JSON lines and Rasa NLU and imported again: exact round trips, the
merge and replace rules, Rasa's own files, and every unreadable file a clear error."""

import warnings

import pytest

from _toy import LABELS, TEXTS, toy_classifier
from dyntc import DynamicClassifier, DyntcError, DyntcWarning
from dyntc.classifier.io import export_labels, import_labels, read_rows, write_rows

AWKWARD = ["a text, with a comma", 'she said "hi"', "naïve café — ünïcödé 東京 🙂", "semi;colon\ttab",
           "# not a comment", "- not a list item", "yes", "x"]


def _label_sets(clf) -> dict:
    return {name: list(support.texts) for name, support in clf.labels_.items()}


@pytest.fixture
def clf():
    c = toy_classifier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)
        c.add_label("odd: names, too", AWKWARD)
    return c


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "rasa"])
def test_export_then_import_round_trips_exactly(clf, fmt, tmp_path):
    path = tmp_path / f"labels.{ {'csv': 'csv', 'jsonl': 'jsonl', 'rasa': 'yml'}[fmt] }"
    summary = export_labels(clf, path)
    assert summary == {"labels": 5, "examples": 40 + len(AWKWARD), "format": fmt, "path": str(path)}
    fresh = toy_classifier()
    fresh.remove_label("timer")
    fresh.add_examples("alarm", ["an extra alarm text"])
    done = import_labels(fresh, path, replace=True)
    assert _label_sets(fresh) == _label_sets(clf)  # same labels, same examples, same order
    assert done["added"] == ["odd: names, too", "timer"] and done["redefined"] == ["alarm"]
    assert sorted(done["unchanged"]) == ["balance", "weather"]
    assert import_labels(fresh, path) == {"added": [], "extended": {}, "redefined": [], "removed": [],
                                          "unchanged": sorted(_label_sets(clf))}  # merging again: nothing new


def test_csv_keeps_line_breaks_and_rasa_refuses_them(tmp_path):
    clf = toy_classifier()
    clf.add_examples("alarm", ["wake me\nat six", 'quote " and, comma\r\nnext'])
    export_labels(clf, tmp_path / "a.csv")
    export_labels(clf, tmp_path / "a.jsonl")
    for name in ("a.csv", "a.jsonl"):
        assert read_rows(tmp_path / name)[10:12] == [("wake me\nat six", "alarm"), ('quote " and, comma\r\nnext', "alarm")]
    with pytest.raises(DyntcError, match=r"2 texts cannot be written to a Rasa NLU file.*line break.*csv or jsonl"):
        export_labels(clf, tmp_path / "a.yml")
    assert not (tmp_path / "a.yml").exists()


def test_rasa_refuses_what_it_would_read_differently():
    for text, why in [(" padded", "white space"), ("fly to [Paris](city)", "entity annotation"), ("bell\x07", "control")]:
        with pytest.raises(DyntcError, match=why):
            write_rows([(text, "x")], "rasa")


def test_merge_adds_new_labels_and_new_examples_only(tmp_path):
    clf = toy_classifier()
    (tmp_path / "more.jsonl").write_text('{"text": "will it hail", "label": "weather"}\n'
                                         '{"text": "will it rain tomorrow", "label": "weather"}\n'
                                         '{"text": "lights on", "label": "lights"}\n'
                                         '{"text": "lights off", "label": "lights"}\n'
                                         '{"text": "dim the lights", "label": "lights"}\n', encoding="utf-8")
    done = import_labels(clf, tmp_path / "more.jsonl")
    assert done["added"] == ["lights"] and done["extended"] == {"weather": 1}
    assert clf.support("weather")[-1] == "will it hail" and len(clf.support("weather")) == 11
    assert set(clf.classes_) == set(LABELS) | {"lights"}  # nothing removed


def test_a_rasa_file_as_rasa_writes_it(tmp_path):
    path = tmp_path / "nlu.yml"
    path.write_text('version: "3.1"\n'
                    "nlu:\n"
                    "- intent: greet\n"
                    "  examples: |\n"
                    "    - hey\n"
                    "    - hello there\n"
                    "    - good morning\n"
                    "- intent: book_flight\n"
                    "  examples: |\n"
                    "    - fly to [Paris](city) on monday\n"
                    '    - a flight to [Rome]{"entity": "city"}\n'
                    "    - book me a plane ticket\n"
                    "- synonym: savings\n"
                    "  examples: |\n"
                    "    - pink pig\n"
                    "- regex: account_number\n"
                    "  examples: |\n"
                    "    - \\d{10,12}\n", encoding="utf-8")
    with pytest.warns(DyntcWarning, match="skipped 2 nlu entries that are not intents"):
        rows = read_rows(path)
    assert rows == [("hey", "greet"), ("hello there", "greet"), ("good morning", "greet"),
                    ("fly to Paris on monday", "book_flight"), ("a flight to Rome", "book_flight"),
                    ("book me a plane ticket", "book_flight")]


def test_int_labels_round_trip_by_name(tmp_path):
    texts = [t for y in LABELS for t in TEXTS[y]]
    clf = DynamicClassifier(encoder="hashing").fit(texts, [LABELS.index(y) + 1 for y in LABELS for _ in TEXTS[y]])
    export_labels(clf, tmp_path / "l.yml")
    assert '- intent: "1"' in (tmp_path / "l.yml").read_text(encoding="utf-8")  # quoted: YAML would read 1 as a number
    clf.remove_label(4)
    import_labels(clf, tmp_path / "l.yml", replace=True)
    assert clf.classes_.tolist() == [1, 2, 3, 4] and clf.support(4) == TEXTS["weather"]


@pytest.mark.parametrize("name, content, match", [
    ("x.csv", "text,intent\nhi,a\n", r"no label column"),
    ("x.csv", "text,label\nhi,a,extra\n", r"record 2: expected a non-empty text and label"),
    ("x.csv", "text,label\n,a\n", r"record 2"),
    ("x.jsonl", '{"text": "hi"}\n', r"line 1: expected"),
    ("x.jsonl", "not json\n", r"line 1: not JSON"),
    ("x.yml", "nlu: [unclosed\n", r"not valid YAML"),
    ("x.yml", "stories: []\n", r"not a Rasa NLU file"),
    ("x.yml", "nlu:\n- intent: a\n  examples: |\n    hello\n", r"does not start with '- '"),
    ("x.yml", "nlu:\n- intent: 7\n  examples: |\n    - hello\n", r"quote a name"),
    ("x.txt", "hello\n", r"cannot tell the format"),
    ("x.csv", "text,label\n", r"holds no examples"),
])
def test_bad_files_are_clear_errors(tmp_path, name, content, match):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DyntcError, match=match):
        read_rows(tmp_path / name)


def test_not_utf8_and_missing_files(tmp_path):
    (tmp_path / "x.csv").write_bytes("text,label\ncaf\xe9,a\n".encode("latin-1"))
    with pytest.raises(DyntcError, match="not UTF-8"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(DyntcError, match="does not exist"):
        read_rows(tmp_path / "nope.csv")
    with pytest.raises(DyntcError, match="unknown format 'xml'"):
        read_rows(tmp_path / "x.csv", "xml")
