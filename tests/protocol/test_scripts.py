"""The scripts under scripts/ that read a run: replay_stopping and compare_runs."""

import json
import sys
from pathlib import Path

import pytest


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.data
def test_replay_stopping_script_finds_a_rule_change(tiny_run, tmp_path, capsys):
    """scripts/replay_stopping.py: a run replays to its own stops under its rule (status 0), and a
    history whose stop the rule would have placed elsewhere is reported (status 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import replay_stopping
    finally:
        sys.path.pop(0)
    out, results = tiny_run
    assert replay_stopping.main(str(out / "results.json")) == 0
    changed = json.loads((out / "results.json").read_text())
    info = changed["pretraining"]["0"]["euc"]
    info["steps"] = info["history"][-1]["step"] + 10  # as if it had run on past the rule's stop
    (tmp_path / "r.json").write_text(json.dumps(changed))
    assert replay_stopping.main(str(tmp_path / "r.json")) == 1
    assert "<- differs" in capsys.readouterr().out


def test_compare_runs_script_pairs_each_cell_with_the_same_models_other_variant(capsys, monkeypatch, tmp_path):
    """scripts/compare_runs.py --versus-variant: the gain of fine-tuning, split by split, beside the
    paper's (its Table 2 fine-tuned minus its Table 3 un-tuned, where both print the n_fine)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import compare_runs
    finally:
        sys.path.pop(0)
    rows = [{"model": "euc", "variant": v, "n_fine": 5, "split": s, "acc_all": a}
            for v, s, a in (("fine-tuned", 0, 0.60), ("un-tuned", 0, 0.55), ("fine-tuned", 1, 0.50), ("un-tuned", 1, 0.52),
                            ("fine-tuned", 2, 0.70))]  # split 2 has no un-tuned cell: not paired
    results = {"dataset": "news", "rows": rows}
    compare_runs.versus_variant(results, compare_runs.cells(results), "un-tuned", per_split=True)
    # (+5.0 − 2.0) / 2 = +1.5, SE = std(+5, −2) / √2 = 4.95 / 1.41 = 3.5; the paper's NEWS EUC at 5:
    # 56.5 fine-tuned − 53.2 un-tuned = +3.3
    assert capsys.readouterr().out.split() == "euc fine-tuned 5: +1.5 (SE 3.5, n=2) [+3.3] (s0 +5.0, s1 -2.0)".split()
    compare_runs.paired(results, compare_runs.cells(results), compare_runs.cells(results), per_split=False, versus="euc")
    assert capsys.readouterr().out == ""  # EUC against itself is not printed
    rows.append({"model": "hyp", "variant": "fine-tuned", "n_fine": 5, "split": 0, "acc_all": 0.66})
    compare_runs.paired(results, compare_runs.cells(results), compare_runs.cells(results), per_split=False, versus="euc")
    assert capsys.readouterr().out.split() == "hyp fine-tuned 5: +6.0 (n=1)".split()  # one split: no SE
    rows.pop()
    # --markdown: ours ± std [paper], bold more than 2 points under the paper; (n=k) where splits are missing
    results["splits"] = 3
    compare_runs.markdown_table(results, compare_runs.cells(results))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| NEWS | n_fine 5 |"
    assert lines[2] == "| EUC fine-tuned | 60.0 ± 10.0 [56.5] |"  # 60.0 >= 56.5 - 2: not bold
    assert lines[3] == "| EUC un-tuned | 53.5 ± 2.1 (n=2) [53.2] |"
    results["rows"] = [dict(r, acc_all=r["acc_all"] - 0.1) for r in rows]
    compare_runs.markdown_table(results, compare_runs.cells(results))
    assert "| EUC fine-tuned | **50.0** ± 10.0 [56.5] |" in capsys.readouterr().out
    # what --markdown cannot combine with is refused by name, not ignored
    never_read = Path(__file__).parent / "_unused.json"  # the arguments are refused before it is opened
    for bad in (["--markdown", "--versus", "euc"], ["--markdown", "--field", "acc_new"], ["--versus-variant", "tuned"],
                ["--claims", "--per-split"]):
        with pytest.raises(SystemExit):
            monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(never_read), *bad])
            compare_runs.main()
    err = capsys.readouterr().err
    assert "--markdown prints a run's acc_all" in err and "invalid choice: 'tuned'" in err
    assert "--claims prints its own table from one run" in err
    # a missing or foreign file is named with the fix, not a traceback
    with pytest.raises(SystemExit, match="not a readable results.json"):
        monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(never_read)])
        compare_runs.main()
    with pytest.raises(SystemExit, match="no 'dataset' and 'rows'"):
        compare_runs.read_results(_write(tmp_path / "other.json", '{"a": 1}'), "--base")


def test_compare_runs_claims_table_pairs_cells_split_by_split(capsys):
    """scripts/compare_runs.py --claims: each claim's paired difference averaged over the splits both
    cells have, `(k/n)` where a model is not ahead on every split, the paper's difference in brackets,
    and the relative error reduction of pretraining where scratch cells exist."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import compare_runs
    finally:
        sys.path.pop(0)
    cells = {("mlp", "fine-tuned"): (0.50, 0.40), ("euc", "fine-tuned"): (0.60, 0.50), ("hyp", "fine-tuned"): (0.62, 0.48),
             ("euc", "scratch"): (0.20, 0.00)}
    rows = [{"model": m, "variant": v, "n_fine": 5, "split": s, "acc_all": a[s], "acc_new": a[s]}
            for (m, v), a in cells.items() for s in (0, 1)]
    results = {"dataset": "news", "splits": 2, "rows": rows}
    compare_runs.claims_table(results, compare_runs.cells(results), compare_runs.cells(results, "acc_new"))
    lines = capsys.readouterr().out.splitlines()
    # EUC − MLP: +10 on both splits [paper NEWS 56.5 − 49.2]; HYP − MLP: (+12 + 8) / 2
    assert lines[2] == "| metric models beat the MLP at low n_fine | EUC 5: +10.0 [+7.3]; HYP 5: +10.0 [+15.6] |"
    # HYP − EUC: +2 and −2, ahead on 1 of 2 splits [64.8 − 56.5]
    assert lines[4] == "| HYP beats EUC at low n_fine (hierarchical data) | fine-tuned 5: +0.0 (1/2) [+8.3] |"
    assert lines[5].endswith("| no such cells |")  # no un-tuned cells
    # (60 − 20) / 80 and (50 − 0) / 100: half the scratch model's errors, beside the paper's Analysis
    assert lines[-1].endswith("| 5: EUC 50% [> 53%] |")
