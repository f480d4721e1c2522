"""The node-local compile cache: unique per job, removed on exit, failure and SIGTERM."""

import os
import subprocess
import sys

import pytest

from tiny_llm.runtime import compile_cache_base, node_local_compile_cache


def test_base_prefers_slurm_tmpdir(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "slurm"))
    assert compile_cache_base() == tmp_path / "slurm"
    monkeypatch.delenv("SLURM_TMPDIR")
    assert compile_cache_base() == tmp_path / "tmp"


def test_removed_after_failure_and_environment_restored(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with pytest.raises(RuntimeError):
        with node_local_compile_cache() as path:
            assert path.parent == tmp_path and path.name.startswith("tiny-llm-compile-77-")
            (path / "kernel.so").write_text("x")
            raise RuntimeError("job failed")
    assert not path.exists() and "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_removed_on_sigterm(tmp_path):
    code = ("import os, signal, sys, time\n"
            "from tiny_llm.runtime import node_local_compile_cache\n"
            "with node_local_compile_cache() as path:\n"
            "    print(path, flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(10)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=60)
    path = result.stdout.strip()
    assert result.returncode == 128 + 15 and path and not os.path.exists(path)
