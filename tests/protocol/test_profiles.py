"""The profiles (`dyntc.protocol.profiles`): their hyperparameters per dataset, `--set` overrides, and
`quick`'s dev sets."""

import pytest

import dyntc.protocol as protocol
from dyntc.errors import DyntcError
from dyntc.protocol import make_plan


def test_profiles_resolve_per_dataset():
    paper = make_plan("news", "paper").hp
    assert paper["n_fine"] == [5, 10, 20, 50, 100, 500] and paper["dropout"] == 0.5 and paper["splits"] == 5
    assert paper["pretrain_episodes"] == 10_000 and paper["pretrain_epochs"] == 100
    assert (paper["n_support"], paper["n_query"], paper["max_classes"], paper["lr"]) == (4, 64, 50, 1e-3)
    assert (paper["hidden_size"], paper["num_layers"]) == (128, 4)
    assert make_plan("wos", "paper").hp["dropout"] == 0.3
    assert make_plan("sent", "paper").n_fine == (5, 10, 20, 100)
    # NEWS's HYP warms up with the Euclidean metric at EUC's rate (chosen on dev_old); SENT's does not
    news_hyp = make_plan("news", "paper").train_config("pretrain", 0, model="hyp")
    assert (news_hyp.euclidean_warmup, news_hyp.euclidean_warmup_lr, news_hyp.lr) == (2000, 1e-3, 1e-3)
    # ... fine-tunes at Adam 3e-4 (its finetune_lr), and trains from scratch as it pretrains (scratch_like_pretraining)
    assert [make_plan("news", "paper").train_config(stage, 0, model="hyp").lr for stage in ("finetune", "scratch")] == [3e-4, 1e-3]
    assert make_plan("sent", "paper").train_config("pretrain", 0, model="hyp").euclidean_warmup == 0
    # --set wins over a per-model entry of the same field (NEWS HYP's lr 1e-3), for every model
    slower = make_plan("news", "paper", settings={"lr": "5e-4"})
    assert {slower.train_config("pretrain", 0, model=m).lr for m in ("mlp", "euc", "hyp")} == {5e-4}
    assert slower.train_config("pretrain", 0, model="hyp").euclidean_warmup == 2000  # the entry's other fields stay
    quick = make_plan("news", "quick")
    assert quick.hp["max_len"] == 128 and make_plan("sent", "quick").hp["max_len"] == 32
    # the selection of cells is not part of the fingerprint, hyperparameters are
    assert make_plan("sent", "quick", splits=1).fingerprint() == make_plan("sent", "quick", splits=4).fingerprint()
    assert make_plan("sent", "quick").fingerprint() != make_plan("sent", "quick", settings={"lr": "0.01"}).fingerprint()


def test_overrides_are_parsed_in_one_place():
    """`--set` of the CLI and of the scripts: FIELD=VALUE pairs, spaces around either side dropped."""
    from dyntc.protocol import parse_overrides

    assert parse_overrides(["lr = 1e-3", "max_norm=none", "field=a=b"]) == {"lr": "1e-3", "max_norm": "none", "field": "a=b"}
    assert parse_overrides(None) == {}
    with pytest.raises(DyntcError, match=r"^settings: give each as FIELD=VALUE \(e.g. lr=1e-3\), got 'lr'$"):
        parse_overrides(["lr=1e-3", "lr"], option="settings")


@pytest.mark.data
def test_quick_keeps_sents_skewed_dev_set_whole_and_caps_the_others(sent, tmp_path):
    """A dev set capped per class is balanced; SENT's labels are skewed, so `quick` keeps its dev sets
    whole, as `paper` does (early stopping then targets the accuracy the test reports)."""
    from collections import Counter

    assert make_plan("news", "quick").hp["dev_per_class"] == 30 and make_plan("sent", "paper").hp["dev_per_class"] is None
    whole = protocol.ProtocolRun(sent, make_plan("sent", "quick"), tmp_path / "a", progress=False, log=lambda msg: None).split_data(0)
    assert len(whole.dev_new) == len(sent.dev) and len(whole.dev_old) == len(whole.split.dev_old) < len(sent.dev)
    counts = Counter(whole.dev_new.labels)
    assert max(counts.values()) > 3 * min(counts.values())  # skewed: what a cap would have flattened
    capped = protocol.ProtocolRun(sent, make_plan("sent", "quick", settings={"dev_per_class": "30"}), tmp_path / "b",
                                  progress=False, log=lambda msg: None).split_data(0)
    assert max(Counter(capped.dev_new.labels).values()) == 30 and len(capped.dev_new) < len(sent.dev)
