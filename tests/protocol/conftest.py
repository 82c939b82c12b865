"""Shared by the protocol tests."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import dyntc.protocol.run as protocol_run
from _protocol import Counter, run_tiny


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The SRU's small matrices run fastest on one thread (much faster on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def stop_first_stage(monkeypatch):
    """The run's first prototypical training stage raises KeyboardInterrupt at its 15th step (a
    simulated kill; the tiny profile's pretraining evaluates and snapshots every 10). ``.snapshots``:
    the snapshot path of every stage started, in order; ``.restore()`` puts the real training back."""
    real = protocol_run.train_prototypical
    snapshots = []

    def stopped_mid_stage(model, train, dev, cfg, *args, **kwargs):
        snapshots.append(cfg.snapshot)
        if len(snapshots) == 1:
            steps = [0]

            def kill_at_15(_n):
                steps[0] += 1
                if steps[0] == 15:
                    raise KeyboardInterrupt("simulated kill")

            cfg = dataclasses.replace(cfg, on_work=kill_at_15)
        return real(model, train, dev, cfg, *args, **kwargs)

    monkeypatch.setattr(protocol_run, "train_prototypical", stopped_mid_stage)
    return SimpleNamespace(snapshots=snapshots,
                           restore=lambda: monkeypatch.setattr(protocol_run, "train_prototypical", real))


@pytest.fixture()
def counted(monkeypatch):
    proto = Counter(protocol_run.train_prototypical)
    sup = Counter(protocol_run.train_supervised)
    monkeypatch.setattr(protocol_run, "train_prototypical", proto)
    monkeypatch.setattr(protocol_run, "train_supervised", sup)
    return proto, sup


@pytest.fixture(scope="module")
def tiny_run(small_sent, tmp_path_factory):
    """A finished `tiny` run on small SENT, once per test module: (its directory, its results)."""
    out = tmp_path_factory.mktemp("tiny")
    results = run_tiny(small_sent, out)
    return out, results
