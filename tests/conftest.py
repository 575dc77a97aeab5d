"""Shared fixtures: seeds, tiny bridges (no files, no network) and the embedded model (slow)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

FV57 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fv57"


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_llama():
    from site_interp.loading import tiny_bridge

    return tiny_bridge("llama")  # 4 query heads, 2 KV heads (GQA)


@pytest.fixture(scope="session")
def tiny_gemma():
    from site_interp.loading import tiny_bridge

    return tiny_bridge("gemma3", n_kv_heads=1)  # 1 KV head, d_head 24 != 64 / 4


@pytest.fixture(scope="session", params=["llama", "gemma3"])
def tiny(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


@pytest.fixture(scope="session")
def gemma():
    from site_interp.loading import load_model

    return load_model("gemma-3-270m", device="cpu")


@pytest.fixture(scope="session")
def fv57() -> Path:
    if not FV57.is_dir():
        pytest.skip(f"the FV-57 data is not at {FV57}")
    return FV57


def toy_task(name: str = "toy", n_train: int = 40, n_valid: int = 8, n_test: int = 8):
    """A tiny letter task for the tiny bridges (character tokenizer)."""
    from site_interp.tasks import Task

    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [{"input": a + b, "output": b} for a in letters for b in letters[:5]]
    random.Random(0).shuffle(pairs)
    return Task(name, pairs[:n_train], pairs[n_train : n_train + n_valid], pairs[n_train + n_valid : n_train + n_valid + n_test])


@pytest.fixture
def toy():
    return toy_task()


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SITE_INTERP_SKIP_SLOW"):
        skip = pytest.mark.skip(reason="SITE_INTERP_SKIP_SLOW is set")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
