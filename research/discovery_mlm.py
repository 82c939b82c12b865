"""Measured: does MTP-CLNN's first stage, masked-language pre-training on the texts to discover in,
help `discover` on a small data set when the backbone is all-MiniLM-L6-v2?

MTP-CLNN (Zhang et al. ACL 2022) first pre-trains BERT on two tasks at once: masked-language
modelling (MLM) on the in-domain texts and a supervised loss on labelled intents; its CLNN stage
comes after. This probe does the in-domain part on a CPU, for ``--budget`` seconds of AdamW steps on
**every** layer of a copy of MiniLM (MLM needs the lower layers: a masked token changes their
output, so they cannot be cached as ``train="backbone"`` caches them):

- ``--mlm W``: W x the MLM loss on ``--batch`` texts drawn from the labelled and unlabelled training
  texts (15 % of the tokens chosen, of which 80 % masked, 10 % replaced by a random token, 10 % kept:
  BERT's recipe). MiniLM ships without an MLM head: its transform is newly initialised, its decoder
  tied to the word embeddings (``BertForMaskedLM``), and only the chosen tokens are decoded;
- ``--sup W``: W x a supervised contrastive loss (``discovery_tuning.supcon``, temperature 0.07) on up
  to 64 labelled texts a step (mean-pooled, unit length: the sentence embedding MiniLM is used with).

The copy is saved as a sentence-transformers directory and the product then runs the protocol's row
``ours`` with it (``DynamicClassifier(encoder=DIR).fit(labelled)``, the default ``discover`` with
``n_new`` given, ``accept``, ``refresh``, ``predict``); ``--base`` runs the same row on MiniLM itself.
Scored on ``--split`` (dev by default: this probe chooses nothing on test). One JSON line per seed.

    flock /tmp/dyntc-bench.lock nice -n 5 python research/discovery_mlm.py --dataset mcid --seeds 0,1,2 \
        --budget 120 [--mlm 1 --sup 1 --lr 5e-5 --batch 32] [--base]

Outcome (docs/discovery.md, "Masked-language pre-training first"): on M-CID every variant at lr 5e-5
lowered the scores, MLM alone the most; at 1e-5 the backbone barely moved and the scores stayed level.
Not a product option.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench.discovery: the protocol and the product's row

from bench.discovery import ADD_EXAMPLES, HEAD, cpu_name, protocol_split, scores  # noqa: E402
from dyntc.classifier.discovery_tuning import supcon  # noqa: E402

MASKED = 0.15  # BERT's: the share of tokens chosen, then 80 % masked / 10 % random / 10 % kept


def mask_tokens(ids: torch.Tensor, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids with BERT's masking, targets: the original id at chosen tokens, -100 elsewhere)."""
    ids = ids.clone()
    special = (ids == tokenizer.cls_token_id) | (ids == tokenizer.sep_token_id) | (ids == tokenizer.pad_token_id)
    chosen = torch.bernoulli(torch.full(ids.shape, MASKED).masked_fill(special, 0.0)).bool()
    targets = ids.masked_fill(~chosen, -100)
    masked = torch.bernoulli(torch.full(ids.shape, 0.8)).bool() & chosen
    ids[masked] = tokenizer.mask_token_id
    randomised = torch.bernoulli(torch.full(ids.shape, 0.5)).bool() & chosen & ~masked
    ids[randomised] = torch.randint(len(tokenizer), ids.shape)[randomised]
    return ids, targets


def pretrain(source: Path, texts: list[str], labelled: list[str], labelled_y: list[str], out: Path, *,
             budget_s: float, mlm: float, sup: float, lr: float, batch: int, seed: int) -> tuple[int, float]:
    """Train a copy of the sentence-transformers model at `source` for `budget_s` seconds, saved at `out`;
    returns (steps, seconds)."""
    from transformers import AutoTokenizer, BertForMaskedLM

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    model = BertForMaskedLM.from_pretrained(str(source))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def tokens(chosen):
        return tokenizer(list(chosen), padding=True, truncation=True, max_length=64, return_tensors="pt")

    classes = sorted(set(labelled_y))
    y = np.array([classes.index(v) for v in labelled_y])
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < budget_s:
        loss = torch.zeros(())
        if mlm:
            b = tokens(texts[i] for i in rng.choice(len(texts), min(batch, len(texts)), replace=False))
            ids, targets = mask_tokens(b["input_ids"], tokenizer)
            hidden = model.bert(input_ids=ids, attention_mask=b["attention_mask"]).last_hidden_state
            chosen = targets != -100
            if bool(chosen.any()):  # only the chosen tokens are decoded (30,522 logits each)
                loss = loss + mlm * torch.nn.functional.cross_entropy(model.cls(hidden[chosen]), targets[chosen])
        if sup:
            idx = rng.choice(len(labelled), min(64, len(labelled)), replace=False)
            b = tokens(labelled[i] for i in idx)
            hidden = model.bert(**b).last_hidden_state
            weights = b["attention_mask"].unsqueeze(-1).float()
            z = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
            loss = loss + sup * supcon(z, torch.from_numpy(y[idx][:, None] == y[idx][None, :]), 0.07)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    seconds = time.perf_counter() - start
    shutil.copytree(source, out)  # tokenizer, pooling and normalisation as MiniLM's; the weights replaced
    model.bert.save_pretrained(str(out))
    return steps, seconds


def main() -> None:
    from dyntc import DynamicClassifier
    from dyntc.core.encoders.pretrained import resolve_backbone
    from dyntc.protocol.data.datasets import load

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="mcid")
    parser.add_argument("--kcr", type=float, default=0.75)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--split", default="dev", choices=("dev", "test"))
    parser.add_argument("--budget", type=float, default=120.0, help="seconds of pre-training")
    parser.add_argument("--mlm", type=float, default=1.0, help="weight of the MLM loss (0: none)")
    parser.add_argument("--sup", type=float, default=1.0, help="weight of the labelled texts' SupCon loss (0: none)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=32, help="texts a step for the MLM loss")
    parser.add_argument("--base", action="store_true", help="MiniLM as it is, no pre-training")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"CPU: {cpu_name()}", flush=True)
    data = load(args.dataset)
    evaluated = data.dev if args.split == "dev" else data.test
    n_total = len(set(data.train.labels))
    source = resolve_backbone("minilm")
    for seed in (int(s) for s in args.seeds.split(",")):
        known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, args.kcr, seed)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            steps, seconds, encoder = 0, 0.0, "minilm"
            if not args.base:
                encoder = str(Path(tmp) / "backbone")
                steps, seconds = pretrain(source, list(dict.fromkeys(labelled[0] + unlabelled)), *labelled,
                                          Path(encoder), budget_s=args.budget, mlm=args.mlm, sup=args.sup,
                                          lr=args.lr, batch=args.batch, seed=seed)
            clf = DynamicClassifier(seed=seed, head=HEAD, encoder=encoder).fit(*labelled)
            found = clf.discover(unlabelled, n_total - len(known))
            clf.accept(found, add_examples=ADD_EXAMPLES)
            if HEAD is not None:
                clf.refresh()
            nmi, ari, acc = scores(evaluated.labels, clf.predict(evaluated.texts))
        print(json.dumps({**vars(args), "seed": seed, "steps": steps, "train_s": round(seconds, 1),
                          "s": round(time.perf_counter() - start, 1),
                          "nmi_ari_acc": [round(nmi, 1), round(ari, 1), round(acc, 1)]}), flush=True)


if __name__ == "__main__":
    main()
