import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("DYNTC_DATA", str(REPO.parent / "shared" / "datasets"))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return Path(os.environ["DYNTC_DATA"])


@pytest.fixture(scope="session")
def sent(data_dir):
    from dyntc.data.datasets import load

    if not (data_dir / "twitter-airline-sentiment" / "Tweets.csv").is_file():
        pytest.skip(f"Tweets.csv not found under {data_dir}")
    return load("sent", data_dir)
