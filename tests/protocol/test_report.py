"""Tables and plots of a run (`dyntc.protocol.report`), on a `tiny` run and on made-up rows."""

import warnings

import pytest

from dyntc.protocol.report import PAPER_TABLE2, aggregate, plot_accuracy, tables_markdown, time_shares

pytestmark = pytest.mark.data  # every test reads the tiny run of real SENT tweets (tests/protocol/conftest.py)


def test_tiny_run_report(tiny_run, tmp_path):
    out, results = tiny_run
    tables = (out / "tables.md").read_text()
    assert "Table 2 layout" in tables and "Table 3 layout" in tables and "Benefits of pretraining" in tables
    mean, std = PAPER_TABLE2["sent"]["hyp"][5]
    assert f"[{mean:.1f} ± {std:.1f}]" in tables  # the paper's number beside ours
    assert "[45.7]" in tables  # Table 3: HYP (un-tuned), n_fine = 5
    for png in ("accuracy_vs_nfine.png", "pretraining_gain.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    agg = aggregate(results)
    assert agg[("euc", "fine-tuned", 5)]["all"][2] == 1  # one split
    assert tables_markdown(results) == tables
    # where the time went: pretraining and each variant's cells, adding up to every recorded second
    shares = time_shares(results)
    assert list(shares) == ["pretraining", "fine-tuned cells", "un-tuned cells", "scratch cells"]
    recorded = sum(i["seconds"] for s in results["pretraining"].values() for i in s.values())
    assert shares["pretraining"] == pytest.approx(recorded)
    assert sum(shares.values()) == pytest.approx(recorded + sum(r["cell_seconds"] for r in results["rows"]))
    assert f"pretraining {shares['pretraining']:.0f}s" in tables and "Where the time went" in tables
    assert time_shares({**results, "rows": [], "pretraining": {}}) == {}
    # a later invocation that ran only n_fine 10 (its header says so) keeps the n_fine 5 columns
    assert "n_fine=5" in tables_markdown({**results, "n_fine": [10]})
    # a run of scratch cells only: no accuracy plot (no line to draw), no matplotlib warning
    scratch_only = {**results, "rows": [r for r in results["rows"] if r["variant"] == "scratch"]}
    assert scratch_only["rows"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_accuracy(scratch_only, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_tables_name_the_models_whose_scratch_cells_take_the_pretraining_recipe(tiny_run):
    _, results = tiny_run
    assert "the pretraining recipe" not in tables_markdown(results)
    config = {**results["config"], "per_model": {"hyp": {"scratch_like_pretraining": True}}}
    text = tables_markdown({**results, "config": config})
    assert "Scratch = the fine-tuning recipe on a freshly initialised model (HYP: the pretraining recipe" in text
    config["per_model"]["hyp"]["scratch_unclipped_warmup"] = True
    assert ("(HYP: the pretraining recipe, scratch_like_pretraining, its Euclidean warm-up without the soft clip, "
            "scratch_unclipped_warmup)" in tables_markdown({**results, "config": config}))


def test_tables_show_scratch_cells_without_a_fine_tuned_pair(tiny_run):
    """A run of scratch cells only (no fine-tuned cell to pair with) still shows their accuracies."""
    _, results = tiny_run
    row = next(r for r in results["rows"] if r["variant"] == "scratch" and r["model"] == "hyp")
    text = tables_markdown({**results, "rows": [row]})
    assert "## Benefits of pretraining" not in text
    line = next(l for l in text.splitlines() if l.startswith("| HYP |") and " / " in l)
    on_all, on_new = line.split("|")[2].strip().split(" / ")
    assert on_all.startswith(f"{100 * row['acc_all']:.1f} ± 0.0") and on_new.startswith(f"{100 * row['acc_new']:.1f} ± 0.0")


def test_the_pretraining_gain_pairs_the_splits(tiny_run):
    """A scratch cell on one split is compared with the fine-tuned cell of that split, not with the
    mean over every split's fine-tuned cells."""
    from dyntc.protocol.report import paired_pretraining_gain

    _, results = tiny_run
    def row(variant, split, acc):
        return {"model": "euc", "variant": variant, "n_fine": 100, "split": split, "acc_all": acc, "acc_new": acc}

    rows = [row("fine-tuned", 0, 0.70), row("fine-tuned", 1, 0.80), row("scratch", 0, 0.60)]
    synthetic = {**results, "splits": 2, "rows": rows}
    (scratch, tuned), = paired_pretraining_gain(synthetic).values()
    assert scratch == pytest.approx((60.0, 0.0, 1)) and tuned == pytest.approx((70.0, 0.0, 1))
    assert "| EUC | 100 | 60.0 ± 0.0 (n=1) | 70.0 ± 0.0 (n=1) | +10.0 | 25% |" in tables_markdown(synthetic)
