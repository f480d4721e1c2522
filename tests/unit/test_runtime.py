"""The node-local compile cache (unique per job, removed on exit, failure and SIGTERM) and the
device lock of a cluster job."""

import os
import subprocess
import sys
import threading

import pytest

from tiny_llm import runtime
from tiny_llm.runtime import compile_cache_base, compile_record, node_local_compile_cache, remove_shared_compile_cache


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
    code = (
        "import os, signal, sys, time\n"
        "from tiny_llm.runtime import node_local_compile_cache\n"
        "with node_local_compile_cache() as path:\n"
        "    print(path, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        timeout=60,
    )
    path = result.stdout.strip()
    assert result.returncode == 128 + 15 and path and not os.path.exists(path)


def test_the_cases_of_a_state_share_one_cache_in_a_slurm_job(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "88")
    key = "ab" * 32
    with node_local_compile_cache(shared_by=key) as first:
        (first / "graph.bin").write_text("compiled once")
    assert first == tmp_path / f"tiny-llm-compile-88-{key[:16]}" and (first / "graph.bin").exists()
    with node_local_compile_cache(shared_by=key) as second:  # the other case finds the graph
        assert second == first and (second / "graph.bin").read_text() == "compiled once"
    with node_local_compile_cache(shared_by="cd" * 32) as other:  # another state: its own
        assert other != first
    remove_shared_compile_cache(key)  # the state's last step
    assert not first.exists() and other.exists()
    with pytest.raises(RuntimeError):
        with node_local_compile_cache(shared_by="cd" * 32):
            raise RuntimeError("a failed case leaves nothing behind")
    assert not other.exists()


def test_outside_slurm_a_shared_cache_is_still_private(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with node_local_compile_cache(shared_by="ab" * 32) as path:
        assert path.name.startswith("tiny-llm-compile-local-")
    assert not path.exists()
    remove_shared_compile_cache("ab" * 32)  # nothing to do


def test_compile_record_counts_graphs_and_seconds():
    import torch

    before = compile_record()
    square = torch.compile(lambda x: (x * x).sum(), backend="eager")
    square(torch.ones(3))
    square(torch.ones(3))  # the same graph again: no new compile
    after = compile_record()
    assert after["graphs"] == before["graphs"] + 1 and after["seconds"] > before["seconds"]
    assert set(after) == {"graphs", "seconds", "cache_hits", "cache_misses"}


def test_the_cases_in_one_cluster_job_take_its_devices_one_at_a_time(monkeypatch, tmp_path, capsys):
    """Marked as a cluster job's Snakemake: a second case waits until the first lets go; unmarked
    (a local run, an interactive allocation), nothing is locked."""
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    monkeypatch.setenv(runtime.GROUP_JOB, "123")
    order = []

    def second():
        with runtime.devices_of_the_job("unseen"):
            order.append("unseen starts")

    with runtime.devices_of_the_job("seen"):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1)
        assert thread.is_alive()  # waiting for the lock
        order.append("seen ends")
    thread.join(timeout=10)
    assert order == ["seen ends", "unseen starts"]
    assert "unseen: waiting until this job's devices are free" in capsys.readouterr().err
    assert (tmp_path / "tiny-llm-devices-123.lock").exists()
    monkeypatch.delenv(runtime.GROUP_JOB)
    with runtime.devices_of_the_job("seen"), runtime.devices_of_the_job("unseen"):
        pass  # not held: no wait


_FAULTS = """
import resource, sys, torch
from tiny_llm.runtime import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
faults = []
for _ in range(8):  # a pass's per-direction temporaries (MiB), made, used and freed one after another
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for size in (24, 16, 8, 20):
        a, b = torch.ones(size << 18), torch.ones(size << 18)
        del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[4:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_without_page_faults():
    """Tensors served by fresh pages fault them in, 256 per MiB, every time (glibc's starting
    threshold, fixed: its default adapts, and whether it settles depends on what came before);
    kept, the heap settles within a few rounds and the later ones reuse it."""

    def faults(mode: str, **environment: str) -> int:
        command = [sys.executable, "-c", _FAULTS, mode]
        out = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ, **environment})
        return int(out.stdout)

    assert faults("fresh", MALLOC_MMAP_THRESHOLD_="131072") > 4 * 6144  # measured: 12,256 a round
    assert faults("kept") < 500  # measured: 0
    assert faults("kept", MALLOC_MMAP_THRESHOLD_="131072") < 500  # the call overrides the environment
