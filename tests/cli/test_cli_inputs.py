"""`dyntc predict --input` reads CSV/TSV/JSONL by column and plain text by line; every user mistake
is one `error:` line with exit status 2 (no typer box, no traceback)."""

import json

import pytest
from _csvfiles import write_csv

TEXTS = ["wake me up at five", "will it rain tomorrow", "how much money do i have"]


def _predicted(out):
    return [json.loads(line)["text"] for line in out.splitlines()]


def test_predict_reads_a_labelled_csv_by_its_text_column(toy_model, dyntc_cli, tmp_path):
    """A `text,label` file predicts its texts: never the header line, never `text,label` as one text."""
    write_csv(tmp_path / "in.csv", [(t, "alarm") for t in TEXTS])
    code, out, err = dyntc_cli("predict", toy_model, "-i", tmp_path / "in.csv")
    assert code == 0, err
    assert _predicted(out) == TEXTS


def test_predict_reads_tsv_jsonl_stdin_and_plain_lines(toy_model, dyntc_cli, tmp_path):
    write_csv(tmp_path / "in.tsv", [(i, t) for i, t in enumerate(TEXTS)], header=("id", "utterance"), delimiter="\t")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"utterance": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)))
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n\n")
    runs = [("-i", tmp_path / "in.tsv", "--text-col", "utterance"), ("-i", tmp_path / "in.jsonl", "--text-col", "utterance"),
            ("-i", tmp_path / "in.txt")]
    for args in runs:
        code, out, err = dyntc_cli("predict", toy_model, *args)
        assert code == 0 and _predicted(out) == TEXTS, (args, err)
    code, out, _ = dyntc_cli("predict", toy_model, "--text-col", "utterance", input="utterance,id\n" + "".join(f"{t},{i}\n" for i, t in enumerate(TEXTS)))
    assert code == 0 and _predicted(out) == TEXTS
    code, out, _ = dyntc_cli("predict", toy_model, input="\n".join(TEXTS))
    assert code == 0 and _predicted(out) == TEXTS


def test_predict_ranking_lists_the_most_probable_labels_with_their_confidences(toy_model, dyntc_cli):
    code, out, err = dyntc_cli("predict", toy_model, "--ranking", "3", input="\n".join(TEXTS))
    assert code == 0, err
    for line in out.splitlines():
        record = json.loads(line)
        names = [r["label"] for r in record["ranking"]]
        confidences = [r["confidence"] for r in record["ranking"]]
        assert len(names) == 3 == len(set(names)) and names[0] == record["label"]
        assert confidences == sorted(confidences, reverse=True) and 0 < sum(confidences) <= 1 + 1e-9
    code, out, _ = dyntc_cli("predict", toy_model, input=TEXTS[0])
    assert code == 0 and "ranking" not in json.loads(out)


def test_predict_names_an_unknown_column(toy_model, dyntc_cli, tmp_path):
    write_csv(tmp_path / "in.csv", [(t, "alarm") for t in TEXTS], header=("sentence", "label"))
    code, out, err = dyntc_cli("predict", toy_model, "-i", tmp_path / "in.csv")
    assert code == 2 and out == ""
    assert err == "error: " + f"{tmp_path / 'in.csv'} has no column 'text'; its columns are ['sentence', 'label']: name the right one with --text-col\n"
    code, _, err = dyntc_cli("predict", toy_model, "-i", tmp_path / "in.csv", "--text-col", "utterance")
    assert code == 2 and "no column 'utterance'" in err


@pytest.mark.parametrize("args, message", [
    (["fit", "--data", "{d}/missing.csv", "--out", "{d}/m", "--encoder", "hashing"], "does not exist"),
    (["fit", "--data", "{d}/train.csv", "--out", "{d}/m", "--encoder", "hashing", "--label-col", "intent"], "no column 'intent'"),
    (["fit", "--data", "{d}/train.csv", "--out", "{d}/m", "--hidden-size", "many"], "Invalid value for '--hidden-size'"),
    (["fit", "--data", "{d}/train.csv", "--out", "{d}/m", "--encoder", "hashing", "--lr", "-1"], "lr must be a number > 0"),
    (["fit", "--data", "{d}/train.csv", "--out", "{d}/m", "--hidden", "64"], "No such option: --hidden"),
    (["fit", "--out", "{d}/m"], "Missing option '--data'"),
    (["fit", "--data", "{d}/train.csv", "--out", "{d}/m", "--encoder", "hashing", "--encoder-options", "runtime"], "expected KEY=VALUE"),
    (["predict", "{d}/model", "-i", "{d}/missing.txt"], "does not exist"),
    (["predict", "{d}/model", "--top-k", "zero"], "Invalid value for '--top-k'"),
    (["predict", "{d}/model", "--ranking", "-1"], "--ranking must be >= 0"),
    (["evaluate", "{d}/model", "--data", "{d}/test.csv", "--label-col", "intent"], "no column 'intent'"),
    (["labels", "list", "{d}/nowhere"], "does not exist"),
    (["labels", "versions", "{d}/model", "--limit", "0"], "--limit must be >= 1"),
    (["labels", "frobnicate", "{d}/model"], "No such command 'frobnicate'"),
])
def test_a_user_mistake_is_one_error_line_with_status_2(toy_model, dyntc_cli, args, message):
    d = toy_model.parent
    code, out, err = dyntc_cli(*[a.format(d=d) for a in args])
    assert code == 2, err
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err and "╭" not in err
