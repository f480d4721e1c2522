"""Atomic writes: all or nothing."""

import json
import os

import pytest

from tiny_llm.io import atomic_directory, atomic_path, atomic_write_json, sha256_file


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "result.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("interrupted")
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_nan_is_refused_and_permissions_are_normal(tmp_path):
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"a": float("nan")})
    assert not (tmp_path / "x.json").exists()
    atomic_write_json(tmp_path / "y.json", [1])
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "y.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert len(sha256_file(tmp_path / "y.json")) == 64


def test_checkpoints_and_caches_get_the_users_umask(tmp_path):
    """Files and folders the project writes are as readable as the user's umask allows, whatever
    mode the writing library chose (safetensors, mkdtemp)."""
    import torch
    from builders import make_oracle_run

    from tiny_llm.model.checkpoint import save_weights

    umask = os.umask(0)
    os.umask(umask)
    save_weights(tmp_path / "w.safetensors", {"x": torch.zeros(2)}, {"step": 0})
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    cache = tmp_path / "run" / "cache"
    make_oracle_run(tmp_path / "run")
    assert cache.stat().st_mode & 0o777 == 0o777 & ~umask
    assert all(f.stat().st_mode & 0o777 == 0o666 & ~umask for f in cache.iterdir() if not f.name.startswith("."))


def test_a_failed_folder_leaves_nothing_not_even_the_folders_made_to_hold_it(tmp_path):
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "kept/new/deeper/out") as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("the export failed")
    assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []
    with atomic_directory(tmp_path / "kept/new/out") as tmp:
        (tmp / "config.json").write_text("{}")
    assert os.listdir(tmp_path / "kept/new/out") == ["config.json"]
