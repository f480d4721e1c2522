"""Indexing: alias grouping by parameter state, training positions."""

import shutil

import pytest
from builders import make_oracle_run

from tiny_llm.training.loop import train
from tiny_llm.workers.index import index_states


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("states")
    config = make_oracle_run(path, epochs=3, tokens=3 * 6 * 3 * 3)
    train(config, path / "run")
    return path / "run"


def test_identical_states_become_aliases(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.copy(copy / "epoch-001.safetensors", copy / "epoch-010.safetensors")  # a renamed duplicate
    index = index_states(copy, "all", consensus=True)
    files = [[a["file"] for a in s["aliases"]] for s in index["states"]]
    assert files == [
        ["epoch-000.safetensors"],
        ["epoch-001.safetensors", "epoch-010.safetensors"],
        ["epoch-002.safetensors"],
        ["epoch-003.safetensors", "final.pt"],
    ]
    assert [s["aliases"][0]["tokens"] for s in index["states"]] == [0, 54, 108, 162]
    assert index["packed"] is False and index["consensus"] is False
    assert all(s["key"] == s["weights_hash"] for s in index["states"])
