"""What every text encoder offers the models and trainers.

An encoder turns texts into vectors in two steps, so that the expensive, text-only part runs once
per text and not once per episode:

1. ``featurize(texts)`` -> one CPU item per text (token ids for the SRU, a cached backbone embedding
   for a frozen pretrained encoder). Deterministic, no gradient; trainers call it once per dataset.
2. ``collate(items)`` -> a dict of batched CPU tensors; ``forward(**batch)`` -> ``(B, output_dim)``.

``config()`` returns a JSON-able dict from which :func:`dyntc.core.encoders.build_encoder` rebuilds an encoder of the
same shape (weights then come from a state dict); it must include ``"kind"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from dyntc.core.progress import embedding_bar
from dyntc.errors import DyntcError


class TextEncoder(nn.Module):
    output_dim: int
    #: Whether a training episode's support and query texts go through the encoder as one batch
    #: (``train_prototypical``). Off by default: a padded batch costs by its longest text, so two
    #: smaller batches are no dearer, and the paper's SRU runs keep their random streams. An encoder
    #: that groups a batch by length itself gains from one larger batch (fewer, fuller groups).
    joint_episodes: bool = False

    def featurize(self, texts: Sequence[str]) -> list[Any]:
        raise NotImplementedError

    def collate(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def training_collator(self, items: Sequence[Any]) -> Callable[[Sequence[int]], dict[str, torch.Tensor]]:
        """``indices -> batch of items[i]`` for a training loop over `items`: ``collate`` here; an
        encoder with a fixed part may compute that part once per item and keep it (a fine-tuned
        backbone's frozen lower layers, ``layer_cache.py``)."""
        return lambda indices: self.collate([items[i] for i in indices])

    def extra_files(self) -> dict[str, Any]:
        """JSON-able objects to save beside the weights (e.g. the vocabulary); see `build_encoder`."""
        return {}

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """Embed `texts` without gradient, batches of similar length; ``(N, output_dim)``."""
        if len(texts) == 0:
            return torch.zeros(0, self.output_dim)
        return embed(self, self, self.featurize(texts), batch_size).cpu()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def module_device(module: nn.Module) -> torch.device:
    """Where `module` lives: the device of its first parameter or buffer; the CPU if it has none
    (e.g. a frozen backbone without head, whose backbone is shared outside the module)."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def config_from_options(config_cls: type, encoder: str, fields: str, **options):
    """`config_cls` (a dataclass of an encoder's options) from keyword options; ``None`` means the
    default, unknown names are refused naming the `encoder` and its `fields`."""
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - set(config_cls.__dataclass_fields__))
    if unknown:
        raise DyntcError(f"options {unknown} do not apply to the {encoder} encoder{fields}")
    return config_cls(**options)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """`module` in eval mode within the block, back in the mode it was in afterwards (also on error)."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@torch.no_grad()
def embed(fn: nn.Module, encoder: TextEncoder, items: Sequence[Any], batch_size: int = 256) -> torch.Tensor:
    """``fn(**batch)`` over `items` in eval mode, batches of similar length; rows in input order.

    `fn` is the encoder itself or a module built on it (a model's ``embed``, an MLP's logits)."""
    device = module_device(fn)
    order = np.argsort([len(x) for x in items], kind="stable")
    out = []
    with eval_mode(fn), embedding_bar(len(items)) as bar:
        for start in range(0, len(items), batch_size):
            chunk = [items[i] for i in order[start : start + batch_size]]
            out.append(fn(**to_device(encoder.collate(chunk), device)).float())
            bar.update(len(chunk))
    if not out:
        raise DyntcError("nothing to embed: the list of texts is empty")
    result = torch.empty_like(torch.cat(out))
    result[torch.as_tensor(order, device=result.device)] = torch.cat(out)
    return result
