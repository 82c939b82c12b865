"""The research probes under research/ (not installed): their options fail before any work, and the
helpers only they use (a finished run read without writing to it, NEWS messages with their headers,
a prototypical network's geometry) do what their headers say."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from _training import fresh
from dyntc.core.inference import prototypical_accuracy
from dyntc.core.models import build_model
from dyntc.core.text import read_glove_file
from dyntc.core.training import TrainConfig, train_prototypical
from dyntc.errors import DyntcError
from dyntc.protocol import make_plan
from dyntc.protocol.data.datasets import load


@pytest.fixture(autouse=True)
def research_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "research"))


@pytest.mark.parametrize("script, extra", [("scratch_warmup_probe", []), ("hyp_diagnose", ["--out", "OUT"])])
def test_diagnostic_scripts_refuse_a_bad_set_by_name(script, extra, tmp_path, capsys):
    """research/scratch_warmup_probe.py and research/hyp_diagnose.py: a bad --set is a usage error, before any work."""
    module = __import__(script)
    extra = [str(tmp_path / "out") if a == "OUT" else a for a in extra]
    for bad, message in ((["--set", "max_norm"], "--set: give each as FIELD=VALUE"),
                         (["--set", "lr=fast"], "lr='fast': expected a number")):
        with pytest.raises(SystemExit) as exit_:
            module.main([*bad, *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_pretrain_stage_script_takes_the_runs_device_and_embeddings(tmp_path):
    """research/pretrain_stage.py runs a selection stage where `dyntc reproduce` would (--device,
    --embeddings reach the plan); a device that is not there is a one-line exit, before any work."""
    import pretrain_stage
    glove = tmp_path / "glove.txt"
    glove.write_text("the " + " ".join(["0.1"] * 50) + "\n")
    args = pretrain_stage.argparse.Namespace(settings=["lr=1e-3"], dataset="news", model="hyp", split=1, profile="paper",
                                             device="cpu", embeddings=glove)
    plan = pretrain_stage._plan(args, selection=True)
    assert plan.device == "cpu" and Path(plan.embeddings) == glove and plan.model_hp("hyp")["lr"] == 1e-3
    assert plan.hp["pretrain_min_episodes"] == plan.hp["pretrain_episodes"]  # a selection run: no early stop
    for bad, message in ((["lr"], "give each as FIELD=VALUE"), (["lr=fast"], "lr='fast': expected a number"),
                         (["learn_scale=maybe"], "learn_scale='maybe': give a flag"),
                         (["--profile", "slow"], "unknown profile 'slow'")):
        with pytest.raises(SystemExit, match=f"pretrain_stage.py: .*{message}"):
            pretrain_stage.main([str(tmp_path / "out"), *bad])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="pretrain_stage.py: --device 'cuda' requested but no CUDA device"):
            pretrain_stage.main([str(tmp_path / "out"), "--device", "cuda"])
    assert not (tmp_path / "out").exists()  # every bad option stops before any work


def test_glove_reduce_keeps_the_words_and_the_geometry_of_the_top_components(tmp_path, monkeypatch):
    """research/glove_reduce.py: PCA to `dim` keeps every word in order; at the full dimension the
    pairwise distances are those of the original vectors (a rotation of the centred cloud); at a
    lower one, of the vectors' projection on their top principal axes; a bad --dim is named."""
    import glove_reduce

    rng = np.random.default_rng(0)
    # variance concentrated on 2 of 6 axes, so 2 components keep nearly all of it
    vectors = rng.normal(size=(40, 6)) * np.array([5.0, 3.0, 0.1, 0.1, 0.1, 0.1]) + 1.0
    words = [f"w{i}" for i in range(40)]
    src = tmp_path / "g.txt"
    src.write_text("".join(f"{w} " + " ".join(f"{v:.8f}" for v in row) + "\n" for w, row in zip(words, vectors)))

    def pairwise(x):
        return np.linalg.norm(x[:, None] - x[None], axis=-1)

    full, kept = glove_reduce.principal_components(vectors, 6)
    assert kept == pytest.approx(1.0) and np.allclose(pairwise(full), pairwise(vectors))
    two, kept = glove_reduce.principal_components(vectors, 2)
    assert 0.99 < kept < 1.0 and np.allclose(pairwise(two), pairwise(vectors), atol=0.5)
    with pytest.raises(DyntcError, match="--dim 7"):
        glove_reduce.principal_components(vectors, 7)

    out = tmp_path / "g2.txt"
    monkeypatch.setattr(sys, "argv", ["glove_reduce.py", str(src), "--dim", "2", "--out", str(out)])
    glove_reduce.main()
    index, reduced = read_glove_file(out)
    assert sorted(index, key=index.get) == words and reduced.shape == (40, 2)
    assert np.allclose(reduced, two, atol=1e-5)

    for argv, message in (([str(src), "--dim", "0"], "--dim 0: must be at least 1"),
                          ([str(src), "--dim", "9"], "--dim 9: must be between 1 and the vectors' 6"),
                          ([str(tmp_path / "none.txt"), "--dim", "2"], "does not exist")):
        monkeypatch.setattr(sys, "argv", ["glove_reduce.py", *argv, "--out", str(tmp_path / "x.txt")])
        with pytest.raises(SystemExit, match=message):
            glove_reduce.main()


@pytest.mark.data
def test_read_only_run_loads_the_runs_weights_and_writes_nothing(tiny_run, small_sent, counted):
    from finished_run import read_only_run

    out, results = tiny_run
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    plan = make_plan("sent", "tiny", models="euc", variants="un-tuned")
    with read_only_run(out, plan, small_sent) as run:
        model = run.pretrained(0, "euc")
    proto, sup = counted
    assert proto.calls == 0 and sup.calls == 0 and model is not None  # loaded, not pretrained again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    with pytest.raises(DyntcError, match="other settings"):
        with read_only_run(out, make_plan("sent", "tiny", settings={"lr": "0.1"}), small_sent):
            pass


@pytest.mark.data
def test_news_raw_messages_keep_their_headers_and_match_the_loader(data_dir):
    from news_headers_probe import read_news_messages

    try:
        ds = load("news", data_dir)
    except DyntcError as exc:  # its files are absent
        pytest.skip(str(exc))
    raw = read_news_messages(data_dir, verify=False, text=lambda message: message)
    assert [len(raw[part][0]) for part in ("train", "test")] == [11314, 7532]
    assert sum(t.startswith("From:") for t in raw["test"][0]) > 7000
    stripped = read_news_messages(data_dir, verify=False)
    assert stripped["test"][1] == raw["test"][1]
    assert set(t for t in stripped["test"][0] if t.strip()) >= set(ds.test.texts[:100])
    with pytest.raises(DyntcError, match="20news-bydate.tar.gz"):
        read_news_messages(data_dir / "no-such-dir")


@pytest.mark.data
def test_monitor_records_geometry_without_changing_training(sent_encoded):
    """research/diagnostics.py: recorded at step 0 and every evaluation, and training is unchanged."""
    from diagnostics import geometry_stats, pretraining_monitor

    encoder, train, dev, _, _ = sent_encoded
    small_dev = dev.per_class(10)
    cfg = TrainConfig(max_episodes=20, eval_every=10, patience=100, eval_support_per_class=10, progress=False, lr=1e-2)
    runs = []
    for monitor in (None, pretraining_monitor(train, small_dev, per_class=10)):
        torch.manual_seed(0)
        model = build_model("hyp", fresh(encoder), len(train.classes))
        runs.append((model, train_prototypical(model, train, small_dev, cfg, monitor=monitor)))
    (m0, plain), (m1, watched) = runs
    assert [h["dev_acc"] for h in plain.history] == [h["dev_acc"] for h in watched.history[1:]]
    for a, b in zip(m0.state_dict().values(), m1.state_dict().values()):
        assert torch.equal(a, b)
    assert watched.history[0]["step"] == 0 and [h["step"] for h in watched.history[1:]] == [10, 20]
    g = watched.history[-1]["geometry"]
    assert g["prototype"]["x0"]["mean"] >= 1.0 and g["query"]["h_norm"]["mean"] > 0
    # the full stats: accuracy agrees with the library's, shares add up, new/old split is consistent
    sup = train.per_class(10)
    stats = geometry_stats(m1, sup, small_dev, new_classes=[0, 1])
    assert stats["acc"] == pytest.approx(prototypical_accuracy(m1, sup, small_dev))
    assert sum(stats["pred_rate"]) == pytest.approx(1.0) and sum(stats["true_rate"]) == pytest.approx(1.0)
    assert stats["new"]["pred_share"] == pytest.approx(sum(stats["pred_rate"][:2]))
    assert stats["new"]["true_share"] + stats["old"]["true_share"] == pytest.approx(1.0)
    # margin > 0 exactly for correctly classified queries: its share is the accuracy (up to ties)
    assert np.isfinite(stats["margin"]["p50"]) and stats["d2_own"]["mean"] > 0


def test_former_seeding_draws_only_where_the_distance_is_positive():
    """research/discovery_seeding.py: the seedings discover replaced draw a centroid with probability
    proportional to a power of 1 - cos; with every point but one on the chosen centroid, that one is
    drawn, for either power; a bad --seeding is a usage error before any work."""
    from discovery_seeding import main, plain_plus_plus

    axes = np.eye(3, dtype=np.float32)
    points = np.concatenate([np.repeat(axes[:1], 5, axis=0), axes[1:2]])
    for power in (1, 2):
        new = plain_plus_plus(points, axes[:1], 1, np.random.default_rng(0), power)
        assert np.array_equal(new, axes[1:2])
    assert plain_plus_plus(points, axes[:0], 3, np.random.default_rng(0)).shape == (3, 3)
    with pytest.raises(SystemExit, match="choose one of plain-cos2, plain, greedy"):
        main(["--seeding", "random"])
    with pytest.raises(SystemExit, match="usage"):
        main(["--split", "dev"])
    with pytest.raises(SystemExit, match="no such file"):
        main(["--seeding", "plain", "--script", "research/no_such_probe.py"])


def test_no_swaps_runs_discover_without_its_swap_search(tmp_path, monkeypatch):
    """research/discovery_seeding.py --no-swaps: the script it runs sees the default mode without the
    swap search nor the split search after it (a run measured before them reruns as it was);
    --no-splits: with the swap search, without the split search; without either flag, with both."""
    from discovery_seeding import main

    from dyntc.classifier import clustering, discovery

    monkeypatch.setitem(discovery.MODE_SETTINGS, "default", dict(discovery.MODE_SETTINGS["default"]))
    monkeypatch.setattr(clustering, "_plus_plus", clustering._plus_plus)
    script, out = tmp_path / "probe.py", tmp_path / "swaps.txt"
    script.write_text("import sys\nfrom dyntc.classifier.discovery import MODE_SETTINGS\n"
                      "d = MODE_SETTINGS['default']\n"
                      "open(sys.argv[1], 'a').write(f\"{d['swaps']},{d['splits']};\")\n")
    main(["--seeding", "greedy", "--script", str(script), str(out)])
    main(["--seeding", "greedy", "--no-swaps", "--script", str(script), str(out)])
    both_on = dict(discovery.MODE_SETTINGS["default"], swaps=True, splits=True)
    monkeypatch.setitem(discovery.MODE_SETTINGS, "default", both_on)
    main(["--seeding", "greedy", "--no-splits", "--script", str(script), str(out)])
    assert out.read_text() == "True,True;False,False;True,False;"


def test_absorbed_report_counts_new_intents_inside_known_labels():
    """research/discovery_absorbed.py: of a new intent's 4 texts, 3 in the known label "alarm" (absorbed),
    of another's 3, 1 in a known label and 2 in a new cluster (not absorbed); known texts right 2 of 3."""
    from discovery_absorbed import absorbed_report

    truth = {f"t{i}": y for i, y in enumerate(["timer"] * 4 + ["song"] * 3 + ["alarm"] * 3)}
    texts = list(truth)
    assignments = ["alarm", "alarm", "alarm", "c1", "alarm", "c2", "c2", "alarm", "alarm", None]
    report = absorbed_report(truth, {"alarm"}, texts, assignments)
    assert report["absorbed"] == ["timer"] and report["new_intents"] == 2
    assert report["new_texts_in_known"] == pytest.approx(4 / 7)
    assert report["known_texts_right"] == pytest.approx(2 / 3)
