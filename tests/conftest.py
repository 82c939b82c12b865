import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("DYNTC_DATA", str(REPO.parent / "shared" / "datasets"))
torch.set_num_threads(min(2, torch.get_num_threads()))

#: The fixtures below that read a data set under DYNTC_DATA (each skips its tests when the files are
#: absent). A test using one, directly or through another fixture, must be marked `data` (registered
#: in pyproject.toml), so that `pytest -m "not data"` is the suite that needs no data set; a test that
#: loads a data set by other means is marked by hand.
DATA_FIXTURES = frozenset({"data_dir", "clinc_raw", "sent", "small_sent", "sent_encoded"})


def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items
                if DATA_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("data") is None]
    if unmarked:
        raise pytest.UsageError("these tests use a data set fixture (" + ", ".join(sorted(DATA_FIXTURES)) + ") but are not "
                                "marked @pytest.mark.data:\n  " + "\n  ".join(unmarked))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return Path(os.environ["DYNTC_DATA"])


@pytest.fixture(scope="session")
def clinc_raw(data_dir) -> dict:
    """CLINC150's data_full.json as parsed JSON (official splits, out-of-scope ones included)."""
    import json

    path = data_dir / "clinc150" / "data_full.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def clinc_intents(clinc_raw) -> dict[str, list[str]]:
    """CLINC150's training texts by intent, in the file's order."""
    groups: dict[str, list[str]] = {}
    for text, label in clinc_raw["train"]:
        groups.setdefault(label, []).append(text)
    return groups


@pytest.fixture(scope="session")
def sent(data_dir):
    from dyntc.protocol.data.datasets import load

    if not (data_dir / "twitter-airline-sentiment" / "Tweets.csv").is_file():
        pytest.skip(f"Tweets.csv not found under {data_dir}")
    return load("sent", data_dir)


@pytest.fixture(scope="module")
def sent_encoded(sent):
    """A small SRU (``_training.SMALL``) on SENT and its featurized splits: ``(encoder, train, dev, test,
    majority test accuracy)``."""
    from collections import Counter

    from _training import SMALL
    from dyntc.core.encoders import create_encoder
    from dyntc.core.inference import Encoded

    classes = sent.labels
    # torch's default generator starts from a random seed in each process: without this the encoder's
    # initial weights, and so every trajectory a test pins (e.g. where patience stops), vary by run
    torch.manual_seed(0)
    encoder = create_encoder("sru", sent.train.texts, **SMALL)
    train, dev, test = (Encoded.of(encoder, s.texts, s.labels, classes) for s in (sent.train, sent.dev, sent.test))
    majority = Counter(test.labels.tolist()).most_common(1)[0][1] / len(test)
    return encoder, train, dev, test, majority


@pytest.fixture(scope="session")
def small_sent(sent):
    """Real SENT tweets, fewer of them (the protocol is the same; the test stays fast)."""
    import numpy as np

    from dyntc.protocol.data.types import Dataset

    def cap(split, per_class, seed):
        rng = np.random.default_rng(seed)
        labels = np.array(split.labels, dtype=object)
        keep = np.concatenate([rng.permutation(np.flatnonzero(labels == y))[:per_class] for y in sorted(set(split.labels))])
        return split.subset(np.sort(keep))

    return Dataset("sent", cap(sent.train, 40, 0), cap(sent.dev, 8, 1), cap(sent.test, 10, 2), None, dict(sent.info))
