"""Which checkpoints an analysis measures: ``all`` in training order, listed files resolved in the
run directory, worker files and strangers refused, and the start-up check against what training
will write. Names only: no checkpoint is read."""

import pytest

from tiny_llm.workers.selection import check_selection, resolve_checkpoints, select_checkpoints


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    (run / "node-0").mkdir(parents=True)
    for name in ("epoch-010.safetensors", "epoch-002.safetensors", "final.pt", "node-0/epoch-002.safetensors"):
        (run / name).write_bytes(b"")
    (run / "notes.txt").write_text("")
    return run


def test_all_selects_epochs_in_training_order_then_final(run):
    names = [p.name for p in select_checkpoints(run, "all")]
    assert names == ["epoch-002.safetensors", "epoch-010.safetensors", "final.pt"]
    assert [p.name for p in select_checkpoints(run, [str(run / "final.pt")])] == ["final.pt"]


def test_selection_errors(run, tmp_path):
    with pytest.raises(ValueError, match="expected 'all' or a non-empty list"):
        select_checkpoints(run, [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoints"):
        select_checkpoints(tmp_path / "empty", "all")
    with pytest.raises(ValueError, match="node-0/epoch-002.safetensors is a worker checkpoint"):
        resolve_checkpoints(run, ["node-0/epoch-002.safetensors"])
    with pytest.raises(ValueError, match="notes.txt: expected a root checkpoint"):
        resolve_checkpoints(run, ["notes.txt"])
    with pytest.raises(ValueError, match="epoch-003.safetensors does not exist"):
        resolve_checkpoints(run, ["epoch-003.safetensors"])


def test_a_configured_selection_is_checked_at_start_up(run):
    check_selection("k", run, "all")
    check_selection("k", run, ["epoch-002.safetensors"])
    check_selection("k", run / "later", ["epoch-001.safetensors"], {"epoch-001.safetensors", "final.pt"})
    for listed, message in (
        (["node-0/epoch-002.safetensors"], "k: node-0/epoch-002.safetensors is a worker checkpoint"),
        (["notes.txt"], "k: notes.txt is not a root checkpoint"),
        (["epoch-003.safetensors"], "k: epoch-003.safetensors does not exist in"),
    ):
        with pytest.raises(ValueError, match=message):
            check_selection("k", run, listed)
    with pytest.raises(ValueError, match="k: epoch-005.safetensors is not a checkpoint that training"):
        check_selection("k", run / "later", ["epoch-005.safetensors"], {"epoch-001.safetensors"})
