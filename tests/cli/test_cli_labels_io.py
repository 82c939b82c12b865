"""`dyntc labels export | import` on a hashing-encoder model: exact round trips through each format,
merge and replace, one version per import, and every mistake one `error:` line with exit status 2."""

import json

import pytest

from _cli import run_cli
from _toy import LABELS, TEXTS, toy_classifier
from dyntc import DynamicClassifier


cli = run_cli


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    toy_classifier().save(path)
    return path


def _sets(path) -> dict:
    return {n: list(s.texts) for n, s in DynamicClassifier.load(path).labels_.items()}


@pytest.mark.parametrize("suffix, fmt", [(".csv", None), (".jsonl", None), (".yml", None), (".txt", "rasa")])
def test_export_import_round_trip(model, tmp_path, suffix, fmt):
    out = tmp_path / f"labels{suffix}"
    args = ["--format", fmt] if fmt else []
    code, _, err = cli("labels", "export", model, "--out", out, *args)
    assert code == 0 and f"wrote 4 labels, 40 examples to {out}" in err
    before = _sets(model)
    other = tmp_path / "other"
    clf = toy_classifier()
    clf.remove_label("timer")
    clf.add_label("lights", ["lights on", "lights off", "dim the lights"])
    clf.save(other)
    code, stdout, err = cli("labels", "import", other, out, "--replace", "--json", *args)
    assert code == 0, err
    assert json.loads(stdout) == {"added": ["timer"], "extended": {}, "redefined": [], "removed": ["lights"],
                                  "unchanged": ["alarm", "balance", "weather"]}
    assert _sets(other) == before
    assert [v["op"] for v in DynamicClassifier.versions(other)][0] == "add_label, remove_label"  # one version


def test_import_merges_by_default(model, tmp_path):
    more = tmp_path / "more.csv"
    more.write_text('text,label\n"lights on, please",lights\nlights off,lights\ndim the lamp,lights\n'
                    "will it hail,weather\n", encoding="utf-8")
    code, _, err = cli("labels", "import", model, more)
    assert code == 0 and "1 added, 1 extended (1 examples)" in err
    sets = _sets(model)
    assert sets["lights"] == ["lights on, please", "lights off", "dim the lamp"]
    assert sets["weather"] == TEXTS["weather"] + ["will it hail"] and set(sets) == set(LABELS) | {"lights"}


@pytest.mark.parametrize("args, match", [
    (["labels", "import", "{model}", "{tmp}/nope.csv"], "does not exist"),
    (["labels", "import", "{model}", "{tmp}/bad.csv", "--replace", "--merge"], "exclude each other"),
    (["labels", "import", "{model}", "{tmp}/bad.csv"], "no label column"),
    (["labels", "export", "{model}", "--out", "{tmp}/x.xml"], "cannot tell the format"),
    (["labels", "export", "{model}", "--out", "{tmp}/x.csv", "--format", "xml"], "unknown format 'xml'"),
])
def test_mistakes_are_one_error_line_and_change_nothing(model, tmp_path, args, match):
    (tmp_path / "bad.csv").write_text("text,intent\nhi,a\n", encoding="utf-8")
    before = DynamicClassifier.versions(model)
    code, _, err = cli(*[a.format(model=model, tmp=tmp_path) for a in args])
    assert code == 2 and err.startswith("error: ") and match in err and err.count("\n") == 1, err
    assert DynamicClassifier.versions(model) == before


def test_labels_list_json_names_tuple_and_int_labels_as_the_other_commands_take_them(tmp_path):
    texts = [t for name in LABELS for t in TEXTS[name][:4]]
    for kind, make in (("tuple", lambda i, name: (name, i)), ("int", lambda i, name: i)):
        labels = [make(i, name) for i, name in enumerate(LABELS) for _ in range(4)]
        path = tmp_path / kind
        DynamicClassifier(encoder="hashing").fit(texts, labels).save(path)
        code, out, err = cli("labels", "list", path, "--json")
        assert code == 0, err
        counts = json.loads(out)
        names = [str(make(i, name)) if kind == "int" else repr(make(i, name)) for i, name in enumerate(LABELS)]
        assert counts == {n: 4 for n in names}
        code, _, err = cli("labels", "add-examples", path, names[0], "-e", "one more example")
        assert code == 0, err
        assert json.loads(cli("labels", "list", path, "--json")[1])[names[0]] == 5
        assert DynamicClassifier.load(path).support_counts()[make(0, LABELS[0])] == 5


def test_a_file_that_cannot_be_written_is_one_error_line(model, tmp_path):
    code, _, err = cli("labels", "export", model, "--out", tmp_path / "no-such-folder" / "labels.csv")
    assert code == 1 and err == f"error: {tmp_path / 'no-such-folder' / 'labels.csv'}: No such file or directory\n"
