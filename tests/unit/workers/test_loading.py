"""What a worker checks before it computes: a state's aliases must be one state, the step Δ to the
next checkpoint as the job's layout holds it, and the cache's tokenizer that of the checkpoints."""

from types import SimpleNamespace

import pytest
import torch
from builders import make_run_config

from tiny_llm.architectures import build_model
from tiny_llm.model.checkpoint import save_weights
from tiny_llm.shapes import Rows
from tiny_llm.workers.loading import check_tokenizer, load_state, step_vector


def _checkpoints(tmp_path, config):
    torch.manual_seed(0)
    first = build_model(config.model).state_dict()
    second = {name: tensor + 0.25 for name, tensor in first.items()}
    for name, state, step in (("epoch-000", first, 0), ("alias", first, 0), ("epoch-001", second, 4)):
        save_weights(tmp_path / f"{name}.safetensors", state, {"step": step, "tokens": 32 * step})
    return first, second


def test_aliases_of_one_state_load_once_and_different_states_are_refused(tmp_path):
    config = make_run_config(tmp_path / "cache")
    first, _ = _checkpoints(tmp_path, config)
    paths = [tmp_path / "epoch-000.safetensors", tmp_path / "alias.safetensors"]
    state = load_state(tmp_path, paths, config, consensus=False)
    assert [a["file"] for a in state.aliases] == ["epoch-000.safetensors", "alias.safetensors"]
    assert all(torch.equal(state.root[name], first[name]) for name in first) and state.key == state.weights_hash
    with pytest.raises(ValueError, match="hold different parameter states; aliases of one state must be identical"):
        load_state(tmp_path, [paths[0], tmp_path / "epoch-001.safetensors"], config, consensus=False)


def test_the_step_is_held_as_the_jobs_layout_holds_every_vector(tmp_path):
    config = make_run_config(tmp_path / "cache")
    first, second = _checkpoints(tmp_path, config)
    state = load_state(tmp_path, [tmp_path / "epoch-000.safetensors"], config, consensus=False)
    following = load_state(tmp_path, [tmp_path / "epoch-001.safetensors"], config, consensus=False)
    names = list(first)
    shapes = tuple(tuple(first[n].shape) for n in names)
    whole = step_vector(state, ({"key": "next"}, following), names, Rows(shapes))
    assert whole.dtype == torch.float64 and whole.shape == (Rows(shapes).D,)
    assert torch.allclose(whole, torch.full_like(whole, 0.25), rtol=0, atol=1e-6)  # float32 weights, +0.25 each
    for rank in range(3):
        rows = Rows(shapes, rank, 3, sharded=True)
        assert torch.equal(step_vector(state, ({"key": "next"}, following), names, rows), whole[rows.indices()])
    assert step_vector(state, None, names, Rows(shapes)) is None


def test_a_cache_of_another_tokenizer_is_refused_naming_both(tmp_path):
    cache = SimpleNamespace(path=tmp_path / "cache", meta={"tokenizer": {"type": "byte", "vocab_size": 256}})
    check_tokenizer(tmp_path, cache, None)  # a run that carries no tokenizer of its own
    carried = {"type": "huggingface", "vocab_size": 50257, "sha256": "abc", "path": "runs/gpt2/tokenizer"}
    with pytest.raises(
        ValueError, match=r"came with .* but the cache .* was encoded with .*prepare-data --source text"
    ):
        check_tokenizer(tmp_path, cache, carried)
