"""Shared fixtures: the tiny dense problem, exactly sized demo runs, determinism, and the order
in which the suite runs. The helpers they use are the importable modules ``oracles`` (exact
references) and ``builders`` (runs and caches)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import make_demo_cache, make_run_config
from oracles import TINY_MODEL, dense_epoch_hessian, dense_model, dense_tokens

from tiny_llm.config import RunConfig
from tiny_llm.data.tokens import capacity_blocks


@pytest.fixture
def tiny_model_config():
    return TINY_MODEL


@pytest.fixture(scope="session")
def dense_problem():
    """The float64 TINY_MODEL, 7 epoch rows (uneven for every batch size) and its explicit Hessian."""
    model, tokens = dense_model(), dense_tokens()
    return model, tokens, dense_epoch_hessian(model, tokens)


@pytest.fixture
def make_config(tmp_path: Path):
    """make_config(**training) -> a RunConfig whose (exactly sized) demo cache exists under tmp_path."""

    def make(**training) -> RunConfig:
        probe = make_run_config(tmp_path / "cache", **training)
        cache = tmp_path / f"cache-{capacity_blocks(probe)['unseen']}"
        config = make_run_config(cache, **training)
        if not cache.exists():
            make_demo_cache(cache, config)
        return config

    return make


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


_FIRST = {"slurm": 0, "integration": 1}


def pytest_collection_modifyitems(config, items):
    """The Slurm tests first, then the integration tests, then the rest (each file's tests in their
    order): with `make test`'s two workers, the Slurm tests, which mostly wait on the cluster,
    overlap the others instead of running alone at the end."""
    items.sort(key=lambda item: _FIRST.get(Path(str(item.fspath)).parent.name, 2))
