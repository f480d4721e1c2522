"""Atomic writes: all or nothing."""

import json
import os

import pytest

from tiny_llm.io import atomic_path, atomic_write_json, sha256_file


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
