"""The frozen lower part of a partly fine-tuned backbone, run once per text instead of once per episode.

A backbone fine-tuned with ``train_layers=k`` (``mode="finetune"``) changes only its top k
transformer layers; its embeddings and lower layers are fixed. :class:`FrozenStates` computes their
output (the hidden states entering the first trained layer) for a training text the first time an
episode draws it, keeps it, and hands the training loop batches of those states: each later episode
runs only the trained layers, the pooling and the normalisation, forward and backward.

The frozen part then runs in eval mode (no dropout), where training without the cache ran it in
train mode with dropout; the trained layers keep their dropout. That is a (slightly) different
training model: ``bench/backbone.py --accuracy`` measured it against the uncached one on the dev
splits (docs/classifier.md, "Fine-tuning the backbone").

Memory: one float32 vector of the backbone's width per word piece, i.e. ``tokens × hidden × 4``
bytes (all-MiniLM-L6-v2: ``tokens × 384 × 4``; CLINC150's 15,000 training texts, about 13 word pieces
each with [CLS] and [SEP], take ~300 MB). Past ``max_bytes`` (default :data:`MAX_BYTES`) the
remaining texts are not kept: their frozen part runs again, in eval mode too, whenever an episode
draws them, so the model trained does not depend on the bound.

Only BERT-style backbones split this way (an ``embeddings`` module, then ``encoder.layer``, each layer
taking the hidden states and the attention mask); :func:`split_matches` checks on a few texts that the
two halves give the backbone's own eval-mode embeddings, and the encoder falls back to running
the whole backbone per episode when they do not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

#: Default bound of a :class:`FrozenStates` cache in bytes (its tensors' storage).
MAX_BYTES = 2 << 30


def transformer(model) -> nn.Module | None:
    """The Hugging Face model inside a sentence-transformers model, if it is BERT-style (embeddings,
    then ``encoder.layer``); else None."""
    first = model[0]
    inner = getattr(first, "auto_model", None) or getattr(first, "transformers_model", None)
    layers = getattr(getattr(inner, "encoder", None), "layer", None)
    if inner is None or getattr(inner, "embeddings", None) is None or not isinstance(layers, nn.ModuleList):
        return None
    return inner


def _mask(inner: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor):
    """The attention mask in the form the model's layers take (what its own forward builds)."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=inner.config, inputs_embeds=hidden, attention_mask=attention_mask)


def _run_layers(inner: nn.Module, layers: Sequence[nn.Module], hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = _mask(inner, hidden, attention_mask)
    for layer in layers:
        hidden = layer(hidden, mask)
        if isinstance(hidden, tuple):  # transformers < 5 returned (hidden_states, ...)
            hidden = hidden[0]
    return hidden


@torch.no_grad()
def lower_states(model, train_layers: int, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, W, hidden)``: the output of the embeddings and the frozen lower layers, in eval mode,
    without gradient. (``no_grad``, not ``inference_mode``: the trained layers save these tensors for
    their backward, which inference tensors refuse.)"""
    inner = transformer(model)
    layers = list(inner.encoder.layer)[: len(inner.encoder.layer) - train_layers]
    modules = [inner.embeddings, *layers]
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        hidden = inner.embeddings(input_ids=input_ids)
        return _run_layers(inner, layers, hidden, attention_mask)
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


def top_embeddings(model, train_layers: int, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, dim)`` sentence embeddings from `hidden` (:func:`lower_states`): the trained top layers,
    then the model's own pooling and normalisation modules."""
    inner = transformer(model)
    layers = list(inner.encoder.layer)[len(inner.encoder.layer) - train_layers:]
    features = {"token_embeddings": _run_layers(inner, layers, hidden, attention_mask), "attention_mask": attention_mask}
    for module in list(model)[1:]:
        features = module(features)
    return features["sentence_embedding"]


@torch.no_grad()
def split_matches(model, train_layers: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  atol: float = 1e-4) -> bool:
    """Whether the two halves give the whole backbone's eval-mode embeddings of this batch."""
    if transformer(model) is None:
        return False
    was_training = model.training
    model.eval()
    try:
        whole = model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]
        split = top_embeddings(model, train_layers, lower_states(model, train_layers, input_ids, attention_mask),
                               attention_mask)
    finally:
        model.train(was_training)
    return whole.shape == split.shape and bool(torch.allclose(whole, split, atol=atol, rtol=0))


class FrozenStates:
    """``indices -> batch`` over a training set's token-id `items` (``PretrainedEncoder.training_collator``):
    ``{"hidden_states": (B, W, hidden), "attention_mask": (B, W)}``, the frozen part's output of each
    text, computed when first drawn and kept while the cache holds less than `max_bytes`."""

    def __init__(self, model, train_layers: int, items: Sequence[torch.Tensor], pad_id: int,
                 max_bytes: int = MAX_BYTES, batch_size: int = 64):
        self.model, self.train_layers, self.items, self.pad_id = model, train_layers, items, pad_id
        self.max_bytes, self.batch_size = max_bytes, batch_size
        self.states: dict[int, torch.Tensor] = {}  # item index -> (length, hidden) on the backbone's device
        self.nbytes = 0
        self.computed = 0  # texts run through the frozen part (cached or not): for benchmarks

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _compute(self, indices: list[int]) -> dict[int, torch.Tensor]:
        """The frozen part's output of `indices`, in length-sorted batches, each padded to its longest."""
        out: dict[int, torch.Tensor] = {}
        order = sorted(indices, key=lambda i: len(self.items[i]))
        device = self._device()
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            seqs = [self.items[i] for i in rows]
            ids = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=self.pad_id).to(device)
            lengths = torch.tensor([len(s) for s in seqs], device=device)
            mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
            hidden = lower_states(self.model, self.train_layers, ids, mask)
            for r, i in enumerate(rows):
                out[i] = hidden[r, : len(self.items[i])].clone()
        self.computed += len(order)
        return out

    def __call__(self, indices: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor]:
        indices = [int(i) for i in indices]
        missing = list(dict.fromkeys(i for i in indices if i not in self.states))
        fresh = self._compute(missing) if missing else {}
        for i, h in fresh.items():
            size = h.element_size() * h.nelement()
            if self.nbytes + size <= self.max_bytes:
                self.states[i] = h
                self.nbytes += size
        rows = [self.states.get(i, fresh.get(i)) for i in indices]
        hidden = nn.utils.rnn.pad_sequence(rows, batch_first=True)
        lengths = torch.tensor([len(h) for h in rows], device=hidden.device)
        mask = (torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]).long()
        return {"hidden_states": hidden, "attention_mask": mask}
