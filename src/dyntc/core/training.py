"""Training and evaluation loops: episodic (prototypical networks) and supervised (MLP).

Texts are featurized once (``Encoded``); loops only collate and run the encoder. Both loops use
Adam, evaluate on dev every so often, stop early after ``patience`` evaluations without
improvement, and finish with the best weights restored (a real copy, not a reference).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from dyntc.core.episodes import EpisodeSampler
from dyntc.core.encoders.base import embed, to_device
from dyntc.errors import DyntcError, is_number
from dyntc.core.inference import Encoded, prototypical_accuracy, supervised_accuracy
from dyntc.core.models import MLPClassifier, PrototypicalNetwork, load_trainable_state
from dyntc.core.progress import budget_total
from dyntc.core.stopping import (
    EarlyStopping,
    finished_state,
    is_held,
    load_snapshot,
    loop_state,
    resume,
    save_snapshot,
    snapshot_key,
)


@dataclass
class TrainConfig:
    lr: float = 1e-3
    # episodic loop: Adam's lr follows a half cosine from lr (episode 1) to 0 (max_episodes), a function
    # of the episode alone, so a resumed loop gets the same rates
    lr_cosine: bool = False
    # supervised loop: the (new) output layer starts as a logistic regression fitted to the frozen
    # encoder's features of the training set (fit_head), and early stopping counts it as epoch 0
    fit_head: bool = False
    # episodic loop, hyperbolic model: the first this many episodes train the encoder with the Euclidean
    # metric (mean prototypes, squared Euclidean distance), at Adam's euclidean_warmup_lr (None: lr), the
    # rest with the model's own metric at lr. From a random encoder HYP can sit at chance-level loss for
    # thousands of episodes where EUC leaves in a few hundred (docs/results.md §8). Dev evaluations always
    # use the model's own metric
    euclidean_warmup: int = 0
    euclidean_warmup_lr: float | None = None
    # with False, the warm-up also runs without the model's soft clip (max_norm), so it is EUC's training
    # exactly; the clip acts from the first hyperbolic episode. From a fresh encoder on 2,000 NEWS texts
    # the clipped warm-up stayed at chance where the unclipped one learnt (docs/results.md §8)
    euclidean_warmup_clip: bool = True
    max_episodes: int = 10_000  # prototypical (paper: 10,000)
    max_epochs: int = 100  # supervised (paper: 100)
    batch_size: int = 64  # supervised
    n_support: int = 4
    n_query: int = 64  # per episode, in total
    max_classes: int = 50
    # share of an episode's classes (at most 0.5) drawn as confusable partners of the others
    # (data/episodes.py); only acts when there are more than max_classes classes
    hard_fraction: float = 0.0
    eval_every: int = 100  # episodes between dev evaluations
    patience: int = 10  # dev evaluations without improvement before stopping
    # held dev evaluations (no stop, not counted towards the patience; dyntc.core.stopping): those before
    # min_steps episodes / epochs, and with hold_at_chance (episodic loop) those while the training loss
    # is still at chance, the slow start of prototypical training at the paper's lr (docs/results.md §7)
    min_steps: int = 0
    hold_at_chance: bool = False
    eval_support_per_class: int | None = None  # dev-time prototypes: at most this many train examples per class
    time_budget_s: float | None = None  # stop (keeping the best weights) after this many seconds
    seed: int = 0
    device: str = "cpu"
    progress: bool = True
    on_work: Callable[[int], None] | None = None  # told the sequences of each episode / batch (a run's ETA)
    # file of the loop's state, rewritten at every dev evaluation: a loop given the same file (same
    # model, data and config) resumes after the last evaluation and ends exactly as an uninterrupted one
    snapshot: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("max_episodes", "max_epochs", "batch_size", "eval_every", "patience"):
            if getattr(self, name) < 1:
                raise DyntcError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_steps < 0:
            raise DyntcError(f"min_steps must be >= 0, got {self.min_steps}")
        if not (isinstance(self.euclidean_warmup, int) and self.euclidean_warmup >= 0):
            raise DyntcError(f"euclidean_warmup must be a whole number of episodes >= 0, got {self.euclidean_warmup!r}")
        if self.euclidean_warmup_lr is not None:
            if not (is_number(self.euclidean_warmup_lr) and self.euclidean_warmup_lr > 0):
                raise DyntcError(f"euclidean_warmup_lr must be None (the lr) or a number > 0, got {self.euclidean_warmup_lr!r}")
            if not self.euclidean_warmup:
                raise DyntcError(f"euclidean_warmup_lr={self.euclidean_warmup_lr} is the learning rate of the Euclidean "
                                 "warm-up, which is off (euclidean_warmup=0): set euclidean_warmup (episodes) too, "
                                 "or euclidean_warmup_lr=none")
        if not isinstance(self.euclidean_warmup_clip, bool):
            raise DyntcError(f"euclidean_warmup_clip must be True or False, got {self.euclidean_warmup_clip!r}")
        if not self.euclidean_warmup_clip and not self.euclidean_warmup:
            raise DyntcError("euclidean_warmup_clip=False turns the soft clip off during the Euclidean warm-up, which "
                             "is off (euclidean_warmup=0): set euclidean_warmup (episodes) too, or leave the clip on")
        if not 0 <= self.hard_fraction <= 0.5:
            raise DyntcError(f"hard_fraction must be in [0, 0.5], got {self.hard_fraction}")
        if not self.lr > 0:
            raise DyntcError(f"lr must be > 0, got {self.lr}")


@dataclass
class TrainResult:
    best_dev_acc: float | None
    steps: int
    seconds: float
    stopped_early: bool
    history: list[dict] = field(default_factory=list)


def cosine_lr(base: float, step: int, total: int) -> float:
    """The rate of episode `step` (1-based) of `total` under a half-cosine decay:
    ``base * (1 + cos(pi * (step - 1) / total)) / 2``, `base` at the first episode, near 0 at the last."""
    return base * 0.5 * (1.0 + math.cos(math.pi * (step - 1) / total))


def episode_lr(base: float, step: int, cfg: TrainConfig) -> float:
    """Adam's rate for episode `step` of a parameter group whose rate is `base` at ``cfg.lr``: scaled by
    ``euclidean_warmup_lr / lr`` during the warm-up (groups keep their ratios), then the cosine decay if set."""
    if step <= cfg.euclidean_warmup and cfg.euclidean_warmup_lr is not None:
        base = base * cfg.euclidean_warmup_lr / cfg.lr
    return cosine_lr(base, step, cfg.max_episodes) if cfg.lr_cosine else base


HEAD_C = (0.001, 0.003, 0.01, 0.03, 0.1, 1.0, 10.0)  # fit_head's inverse L2 strengths, one chosen on dev


@torch.no_grad()
def fit_head(model: MLPClassifier, train: Encoded, dev: Encoded | None, seed: int) -> float:
    """Set ``model.head`` to a multinomial logistic regression on the encoder's eval-mode features of
    `train` (L-BFGS to convergence, features standardised on `train`), its L2 strength the one of
    :data:`HEAD_C` best on `dev` (the largest C without `dev`); returns that dev accuracy (nan without).

    Why: with n_fine examples per class an epoch is a batch or two, and early-stopped Adam steps hardly
    move a fresh random layer (docs/results.md §8.3)."""
    from sklearn.linear_model import LogisticRegression

    if len(train.classes) != model.head.out_features:
        raise DyntcError(f"fit_head: the head has {model.head.out_features} outputs but the training set names "
                         f"{len(train.classes)} classes; call model.replace_head(len(train.classes)) first")
    if len(np.unique(train.labels)) != len(train.classes):
        raise DyntcError(f"fit_head needs every one of the head's {model.head.out_features} classes in the training "
                         f"set; it has {len(np.unique(train.labels))}")
    x = embed(model.encoder, model.encoder, train.items).double().cpu().numpy()
    mean, std = x.mean(0), x.std(0) + 1e-6
    x_dev = None if dev is None else (embed(model.encoder, model.encoder, dev.items).double().cpu().numpy() - mean) / std
    best = None
    for c in HEAD_C if dev is not None else HEAD_C[-1:]:
        clf = LogisticRegression(C=c, max_iter=5000, random_state=seed).fit((x - mean) / std, train.labels)
        acc = float((clf.predict(x_dev) == dev.labels).mean()) if dev is not None else float("nan")
        if best is None or acc > best[0]:
            best = (acc, clf)
    acc, clf = best
    coef, intercept = clf.coef_, clf.intercept_
    if coef.shape[0] == 1:  # two classes: one logit difference, split evenly into two logits
        coef, intercept = np.vstack([-coef / 2, coef / 2]), np.concatenate([-intercept / 2, intercept / 2])
    weight = coef / std  # the layer on the raw features
    model.head.weight.copy_(torch.as_tensor(weight, dtype=model.head.weight.dtype))
    model.head.bias.copy_(torch.as_tensor(intercept - weight @ mean, dtype=model.head.bias.dtype))
    return acc


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over the trainable parameters; an encoder may ask for its own groups (e.g. a pretrained
    backbone with a smaller learning rate than its head) through ``param_groups(lr)``."""
    encoder = getattr(model, "encoder", None)
    if encoder is None or not hasattr(encoder, "param_groups"):
        return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    groups = [g for g in encoder.param_groups(lr) if any(p.requires_grad for p in g["params"])]
    in_encoder = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_encoder]
    return torch.optim.Adam(groups + ([{"params": rest, "lr": lr}] if rest else []), lr=lr)


def episode_loss(model: PrototypicalNetwork, collate, ep, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, logits)`` of one sampled episode; support and query embedded in one batch when the
    encoder asks for it (``TextEncoder.joint_episodes``), else apart."""
    support_labels = torch.as_tensor(ep.support_labels, device=device)
    query_labels = torch.as_tensor(ep.query_labels, device=device)
    if model.encoder.joint_episodes:
        points = model.embed(**to_device(collate([*ep.support, *ep.query]), device))
        n = len(ep.support)
        return model.points_loss(points[:n], support_labels, points[n:], query_labels, ep.n_classes)
    return model.episode_loss(to_device(collate(ep.support), device), support_labels,
                              to_device(collate(ep.query), device), query_labels, ep.n_classes)


def train_prototypical(
    model: PrototypicalNetwork, train: Encoded, dev: Encoded | None, cfg: TrainConfig,
    monitor: Callable[[PrototypicalNetwork], dict] | None = None,
) -> TrainResult:
    """Episodic training (Adam on cross-entropy over ``softmax(-d²)``), early stopping on dev accuracy
    with prototypes built from the training set.

    `monitor(model)`, if given, is called before the first episode and at every dev evaluation; the
    dict it returns is added to that step's history record (e.g. ``pretraining_monitor`` of research/diagnostics.py).
    """
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    model.to(device).train()
    sampler = EpisodeSampler(
        train.labels, n_support=cfg.n_support, n_query=cfg.n_query, max_classes=cfg.max_classes,
        seed=cfg.seed, names=train.classes, hard_fraction=cfg.hard_fraction,
    )
    dev_support = train.per_class(cfg.eval_support_per_class, seed=cfg.seed)
    collate = model.encoder.training_collator(train.items)  # a fine-tuned backbone's frozen part: once per text
    optimizer = make_optimizer(model, cfg.lr)
    base_lrs = [g["lr"] for g in optimizer.param_groups]  # before a resume loads the decayed ones
    stopper = EarlyStopping(model, cfg.patience)
    history: list[dict] = []
    start = time.perf_counter()
    stopped_early, step, running = False, 0, []
    chance = math.log(sampler.n_way)  # the loss of uniform logits over an episode's classes
    key, state, finished = _start_from_snapshot(cfg, "prototypical", model, chance)
    if finished is not None:
        return finished
    if state is not None:
        step = resume(state, model, optimizer, stopper, device)
        history = state["history"]
        sampler.set_state(state["sampler"])
        start -= state["elapsed"]
    elif monitor is not None:
        history.append({"step": 0, **monitor(model)})
    first, loop_start = step + 1, time.perf_counter()
    bar = tqdm(range(first, cfg.max_episodes + 1), desc=f"{model.metric[:3]} episodes", disable=not cfg.progress, leave=False)
    for step in bar:
        ep = sampler.sample()
        warming = step <= cfg.euclidean_warmup
        with (model.metric_as("euclidean") if warming else nullcontext(),
              model.clip_suspended() if warming and not cfg.euclidean_warmup_clip else nullcontext()):
            loss, logits = episode_loss(model, collate, ep, device)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"episode {step}: loss is {loss.item()} (lower the learning rate?)")
        if cfg.hard_fraction > 0:
            sampler.record(ep, logits.detach().softmax(1).cpu().numpy())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.lr_cosine or cfg.euclidean_warmup_lr is not None:
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = episode_lr(base, step, cfg)
        optimizer.step()
        running.append(loss.item())
        if cfg.on_work is not None:
            cfg.on_work(len(ep.support) + len(ep.query))
        now = time.perf_counter()
        out_of_time = cfg.time_budget_s is not None and now - start > cfg.time_budget_s
        if cfg.time_budget_s is not None and not bar.disable:  # the ETA is the budget's when it ends first
            bar.total = budget_total(step, first, cfg.max_episodes, now - start, now - loop_start, cfg.time_budget_s) - first + 1
        if dev is not None and (step % cfg.eval_every == 0 or step == cfg.max_episodes or out_of_time):
            acc = prototypical_accuracy(model, dev_support, dev)
            history.append({"step": step, "loss": float(np.mean(running)), "dev_acc": acc})
            if monitor is not None:
                history[-1].update(monitor(model))
            running = []
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", dev=f"{acc:.3f}", best=f"{max(acc, stopper.best or 0):.3f}")
            if stopper.update(acc, is_held(cfg, step, history[-1]["loss"], chance)):
                stopped_early = True
                break
            if cfg.snapshot is not None and not out_of_time:
                save_snapshot(cfg.snapshot, {**loop_state(cfg, key, step, model, optimizer, stopper, device, start),
                                             "history": history, "sampler": sampler.state()})
        if out_of_time:
            break
    bar.close()
    stopper.restore()
    return _finish(cfg, key, model, TrainResult(stopper.best, step, time.perf_counter() - start, stopped_early, history))


def train_supervised(model: MLPClassifier, train: Encoded, dev: Encoded | None, cfg: TrainConfig) -> TrainResult:
    """Mini-batch cross-entropy training of the MLP baseline, early stopping on dev accuracy per epoch."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    device = torch.device(cfg.device)
    if cfg.euclidean_warmup:  # (a warm-up rate alone is refused by TrainConfig)
        raise DyntcError("euclidean_warmup applies to episodic training of the hyperbolic model only, not to the MLP")
    if cfg.lr_cosine:
        raise DyntcError("lr_cosine applies to episodic (EUC/HYP) training only, not to the MLP; "
                         "set it per model (per_model / --tune-grid hyp.lr_cosine=1)")
    model.to(device).train()
    collate = model.encoder.training_collator(train.items)
    optimizer = make_optimizer(model, cfg.lr)
    stopper = EarlyStopping(model, cfg.patience)
    history: list[dict] = []
    start = time.perf_counter()
    stopped_early, epoch, step = False, 0, 0
    labels = torch.as_tensor(train.labels)
    n_batches = math.ceil(len(train) / cfg.batch_size)
    key, state, finished = _start_from_snapshot(cfg, "supervised", model)
    if finished is not None:
        return finished
    if state is not None:
        epoch = resume(state, model, optimizer, stopper, device)
        history, step = state["history"], state["batches"]
        rng.bit_generator.state = state["numpy_rng"]
        start -= state["elapsed"]
    if cfg.fit_head and state is None:
        acc = fit_head(model, train, dev, cfg.seed)
        if dev is not None:
            history.append({"epoch": 0, "dev_acc": acc})
            stopper.update(acc)
    bar = tqdm(total=cfg.max_epochs * n_batches, initial=step, desc="mlp batches", disable=not cfg.progress, leave=False)
    for epoch in range(epoch + 1, cfg.max_epochs + 1):
        order = rng.permutation(len(train))
        losses = []
        for b in range(n_batches):
            idx = order[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            batch = to_device(collate(idx), device)
            loss = nn.functional.cross_entropy(model(**batch), labels[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if cfg.on_work is not None:
                cfg.on_work(len(idx))
            bar.update()
        out_of_time = cfg.time_budget_s is not None and time.perf_counter() - start > cfg.time_budget_s
        if dev is not None:
            acc = supervised_accuracy(model, dev)
            history.append({"epoch": epoch, "loss": float(np.mean(losses)), "dev_acc": acc})
            bar.set_postfix(loss=f"{np.mean(losses):.3f}", dev=f"{acc:.3f}")
            if stopper.update(acc, is_held(cfg, epoch, None, None)):
                stopped_early = True
                break
            if cfg.snapshot is not None and not out_of_time:
                save_snapshot(cfg.snapshot, {**loop_state(cfg, key, epoch, model, optimizer, stopper, device, start),
                                             "history": history, "batches": step, "numpy_rng": rng.bit_generator.state})
        if out_of_time:
            break
    bar.close()
    stopper.restore()
    return _finish(cfg, key, model, TrainResult(stopper.best, step, time.perf_counter() - start, stopped_early, history))


def _start_from_snapshot(cfg: TrainConfig, kind: str, model: nn.Module, chance: float | None = None
                         ) -> tuple[str, dict | None, TrainResult | None]:
    """The loop's snapshot key; the state to resume from, if any; or, when the snapshot is of the
    finished loop, its result (with its weights loaded into `model`)."""
    key, state = snapshot_key(cfg, kind, model), load_snapshot(cfg, kind, chance, model)
    if state is not None and state.get("done"):
        load_trainable_state(model, state["model"])
        return key, None, TrainResult(**state["result"])
    return key, state, None


def _finish(cfg: TrainConfig, key: str, model: nn.Module, result: TrainResult) -> TrainResult:
    """The final snapshot holds the result: a loop restarted before its caller used the result
    returns it at once (the caller removes the file once its output is saved)."""
    if cfg.snapshot is not None:
        save_snapshot(cfg.snapshot, finished_state(cfg, key, model, result))
    return result
