"""The runtime of a job: the device it asked for, a cluster job's device lock, and a private, disposable
torch.compile cache."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "GROUP_JOB",
    "announce_job",
    "compile_cache_base",
    "compile_record",
    "devices_of_the_job",
    "die_with_parent",
    "keep_freed_memory",
    "node_local_compile_cache",
    "remove_shared_compile_cache",
    "resolve_device",
]

GROUP_JOB = "TINY_LLM_GROUP_JOB"
"""Set in the Snakemake process that runs a cluster job's rules: the Slurm job id (else its process id)."""


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when available) as a torch device.

    Raises:
        ValueError: an unknown device, or CUDA asked for where none is available.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected cpu, cuda, cuda:N or auto, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; elsewhere nothing):
    a rank whose launcher was killed stops instead of computing on. Exits at once when the parent
    is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), sig)


HEAP_TENSORS = 32 << 20
"""Bytes below which glibc serves an allocation from its heap, not from fresh pages (its largest)."""
HEAP_KEPT = 256 << 20
"""Freed bytes at the top of glibc's heap that it keeps for reuse instead of returning them."""


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep freed memory for the next tensor (Linux with glibc; elsewhere
    nothing). True when it took effect.

    A CPU pass allocates and frees per-direction tensors of many megabytes. By default glibc returns
    them to the system and the next one arrives as fresh pages, zeroed by the kernel one fault at a
    time: 0.5–1 GB of page faults per adjoint pass at the 0.8M benchmark shape (K = 16), about 6 % of
    its time, against none in a gradient pass. Tensors below ``HEAP_TENSORS`` then come from the
    heap, and up to ``HEAP_KEPT`` of freed memory stays there, so memory in use grows by at most
    that; the numbers do not change. Called by the command line, the workflow's analysis jobs and
    each rank."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
    return mallopt(M_MMAP_THRESHOLD, HEAP_TENSORS) == 1 and mallopt(M_TRIM_THRESHOLD, HEAP_KEPT) == 1


_REQUESTED = (
    "runtime",
    "cpus_per_task",
    "cpus_per_gpu",
    "mem_mb",
    "mem_mb_per_cpu",
    "gpu",
    "gpu_model",
    "nodes",
    "slurm_partition",
    "slurm_account",
)


def announce_job(resources, threads: int) -> None:
    """Tell the results what the workflow asked for this job: its attempt (1 + retries) and its
    requested resources (walltime minutes, CPUs, memory, GPUs, partition, account, threads), read
    from Snakemake's ``resources`` of the job; recorded in each result's ``slurm`` block."""
    os.environ["TINY_LLM_ATTEMPT"] = str(getattr(resources, "attempt", 1))
    requested = {name: getattr(resources, name, None) for name in _REQUESTED}
    os.environ["TINY_LLM_REQUESTED"] = json.dumps({**requested, "threads": threads})


_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def compile_cache_base() -> Path:
    """``$SLURM_TMPDIR``, else ``$TMPDIR``, else ``/tmp``: the node's scratch space."""
    for variable in ("SLURM_TMPDIR", "TMPDIR"):
        if os.environ.get(variable):
            return Path(os.environ[variable])
    return Path("/tmp")


@contextlib.contextmanager
def devices_of_the_job(what: str) -> Iterator[None]:
    """Inside a cluster job's Snakemake (``TINY_LLM_GROUP_JOB`` set): hold the job's device lock
    while ``what`` runs. Snakemake starts the cases of a state side by side in their group job,
    while the job holds the GPUs (and CPUs) for one of them at a time; with the lock they run one
    after another, as the job was sized. Elsewhere (a local run, an interactive allocation) nothing:
    there Snakemake's own resources decide what runs at once.

    Example:
        >>> with devices_of_the_job("a local step"):
        ...     pass
    """
    job = os.environ.get(GROUP_JOB)
    if not job:
        yield
        return
    with open(compile_cache_base() / f"tiny-llm-devices-{job}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"{what}: waiting until this job's devices are free (another case or spectrum has them)",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def _shared_path(shared_by: str) -> Path | None:
    job = os.environ.get("SLURM_JOB_ID")
    return compile_cache_base() / f"tiny-llm-compile-{job}-{shared_by[:16]}" if job else None


def remove_shared_compile_cache(shared_by: str) -> None:
    """Remove the cache that the processes of this Slurm job shared under ``shared_by`` (the
    last step of a state's job does this); nothing outside Slurm."""
    path = _shared_path(shared_by)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def compile_record() -> dict[str, float | int]:
    """What ``torch.compile`` did in this process so far: graphs compiled, seconds spent compiling,
    and the inductor cache's hits and misses (a hit reuses a graph that an earlier process of the
    same job compiled)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "seconds": float(sum(compilation_time_metrics.get("_compile.compile_inner", []))),
        "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
    }


@contextlib.contextmanager
def node_local_compile_cache(shared_by: str | None = None) -> Iterator[Path]:
    """Point the inductor and Triton caches at a directory of this job's, removed on failure and
    on catchable termination (SIGTERM, SIGHUP, SIGINT become SystemExit so the cleanup runs), and
    on normal exit unless shared. SIGKILL or a node failure leave it to the node's scratch cleanup.

    ``shared_by`` (a state key) names one directory for every process of the Slurm job that passes
    it: the cases of one state run one after another in one job, and the second finds the graphs
    the first compiled. A shared directory survives normal exit; the state's last step removes it
    with :func:`remove_shared_compile_cache`. Outside Slurm each process has its own.

    Example:
        >>> with node_local_compile_cache() as path:
        ...     os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
        True
        >>> path.exists()
        False
    """
    job = os.environ.get("SLURM_JOB_ID", "local")
    shared = _shared_path(shared_by) if shared_by else None
    if shared is not None:
        shared.mkdir(parents=True, exist_ok=True)
    path = shared or Path(tempfile.mkdtemp(prefix=f"tiny-llm-compile-{job}-", dir=compile_cache_base()))
    saved_env = {name: os.environ.get(name) for name in _CACHE_VARIABLES}
    saved_handlers = {}
    for sig in _SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread
            saved_handlers[sig] = signal.signal(sig, _terminate)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    finished = False
    try:
        yield path
        finished = True
    finally:
        if not finished or shared is None:
            shutil.rmtree(path, ignore_errors=True)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
