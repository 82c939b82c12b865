"""The model half of a :class:`~dyntc.classifier.DynamicClassifier`: encoder + metric as a space for texts.

:class:`MetricSpace` wraps a trained :class:`~dyntc.core.models.PrototypicalNetwork` with what the label
set and the classifier need: points of texts (batched, no gradient, float32 on the CPU), prototypes
of groups of points (one batched mean or Fréchet mean), and squared distances. It also owns the
weights' serialisation, so that a label operation that leaves the weights alone stores none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from dyntc.core.encoders import build_encoder
from dyntc.core.encoders.base import eval_mode, module_device
from dyntc.errors import DyntcError
from dyntc.core.models import PrototypicalNetwork, load_trainable_state, trainable_state


class MetricSpace:
    """Texts -> points; points -> prototypes; (points, prototypes) -> squared distances.

    ``device``, ``batch_size`` and ``extend_vocab`` are plain attributes the classifier keeps in
    step with its parameters."""

    def __init__(self, model: PrototypicalNetwork, *, device: str = "cpu", batch_size: int = 256,
                 extend_vocab: bool = True):
        self.model = model.eval()
        self.device = device
        self.batch_size = batch_size
        self.extend_vocab = extend_vocab
        self._weights_hash: str | None = None  # hash of the weights as last serialised; None once they change

    @property
    def metric(self) -> str:
        return self.model.metric

    @property
    def dim(self) -> int:
        """Coordinates of a point: d (Euclidean) or d + 1 (hyperboloid)."""
        return self.model.encoder.output_dim + self.model.space.extra_coordinates

    # ---------------------------------------------------------------- points

    def _on_device(self) -> PrototypicalNetwork:
        device = torch.device(self.device)
        if module_device(self.model) != device:
            self.model.to(device)
        return self.model

    def featurize(self, texts: Sequence[str]) -> list[Any]:
        return self.model.encoder.featurize(texts)

    def embed(self, texts: Sequence[str], items: list | None = None) -> torch.Tensor:
        """Points of `texts` (or of their already featurized `items`): ``(n, dim)`` float32, CPU."""
        from dyntc.core.inference import embed_points

        if not texts:
            return torch.zeros(0, self.dim)
        model = self._on_device()
        if items is None:
            items = model.encoder.featurize(texts)
        with torch.inference_mode():
            return embed_points(model, items, self.batch_size).float().cpu()

    def embed_new(self, texts: Sequence[str]) -> torch.Tensor:
        """Points of the examples of a label operation: first lets the vocabulary take their new words."""
        self.extend_vocabulary(texts)
        return self.embed(texts)

    def extend_vocabulary(self, texts: Sequence[str]) -> int:
        """Let an encoder that can grow its vocabulary (GloVe + SRU) take the new words of `texts`."""
        extend = getattr(self.model.encoder, "extend_vocabulary", None)
        if not self.extend_vocab or not texts or extend is None:
            return 0
        added = extend(texts)
        if added:
            self._weights_hash = None  # the frozen embedding grew
        return added

    # ---------------------------------------------------------------- prototypes and distances

    def means(self, groups: Sequence[torch.Tensor]) -> torch.Tensor:
        """One prototype per group of points: ``(len(groups), dim)``, a single batched (Fréchet) mean."""
        if not groups:
            return torch.zeros(0, self.dim)
        points = torch.cat(list(groups))
        ids = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
        with eval_mode(self.model) as model, torch.inference_mode():
            return model.prototypes(points.double(), ids, len(groups)).float()

    def sq_distances(self, points: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
        """``(n, k)`` squared distances; hyperbolic ones in float64 (float32 hyperboloid coordinates
        lose small distances), returned as float32."""
        if self.model.space.needs_float64:
            return self.model.sq_distances(points.double(), prototypes.double()).float()
        return self.model.sq_distances(points, prototypes)

    # ---------------------------------------------------------------- persistence

    def document(self) -> dict:
        """JSON-able description from which :meth:`from_document` rebuilds the model (weights apart)."""
        encoder = self.model.encoder
        return {"model": self.model.config(), "encoder": encoder.config(), "encoder_files": encoder.extra_files(),
                "dim": self.dim}

    def weights(self) -> tuple[bytes | None, str]:
        """``(safetensors bytes, hash)``; bytes are None when the weights are unchanged since the last
        call (the store then refers to them by hash). A pretrained backbone's frozen layers are left
        out (:func:`stored_state`): only what was trained is stored."""
        if self._weights_hash is not None:
            return None, self._weights_hash
        state = {k: v.detach().cpu().contiguous() for k, v in stored_state(self.model).items()}
        data = save_safetensors(state)
        self._weights_hash = hashlib.sha256(data).hexdigest()
        return data, self._weights_hash

    @property
    def weights_dirty(self) -> bool:
        """Whether the weights changed since they were last serialised (training, vocabulary growth)."""
        return self._weights_hash is None

    def weights_changed(self) -> None:
        """Call after training: the next :meth:`weights` serialises them again."""
        self._weights_hash = None

    @classmethod
    def from_document(cls, document: dict, weights: bytes, weights_hash: str, **options) -> "MetricSpace":
        try:
            encoder = build_encoder(document["encoder"], document.get("encoder_files") or {})
            model = PrototypicalNetwork(encoder, **document["model"])
            state = load_safetensors(weights)
        except (KeyError, TypeError, ValueError) as exc:
            raise DyntcError(f"the stored model is damaged ({type(exc).__name__}: {exc}); restore another version") from exc
        try:
            load_trainable_state(model, state)
        except (DyntcError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[-1][:300]
            raise DyntcError(f"the stored weights do not match the stored model description ({first})") from exc
        if set(model.state_dict()) - set(state):  # frozen layers taken from the backbone's files: the same?
            _check_backbone_weights(document, model)
        space = cls(model, **options)
        space._weights_hash = weights_hash
        return space


def stored_state(model: PrototypicalNetwork) -> dict[str, torch.Tensor]:
    """What a store keeps of `model`'s weights: with a pretrained backbone (whose files are
    fingerprinted) only the trainable tensors (:func:`~dyntc.core.models.trainable_state`; a tuned
    MiniLM's top two layers, ~14 MB of its ~90 MB), since the frozen ones are the backbone's own and
    are read from its files again; with any other encoder the whole state."""
    if not (getattr(model.encoder, "fingerprint", None) or {}).get("weights"):
        return model.state_dict()
    return trainable_state(model)


def _check_backbone_weights(document: dict, model: PrototypicalNetwork) -> None:
    saved = ((document.get("encoder") or {}).get("fingerprint") or {}).get("weights")
    now = (getattr(model.encoder, "fingerprint", None) or {}).get("weights")
    if saved is None or saved != now:
        raise DyntcError(f"the stored model keeps only the layers it trained and takes the others from its backbone, "
                         f"whose weights differ from those it was trained on (fingerprint {saved} saved, {now} now): "
                         "install the same model version")
