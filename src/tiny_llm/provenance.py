"""What produced a result: source version, software, hardware, Slurm job, canonical hashing."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["canonical_hash", "freeze_source", "hardware", "slurm_job", "software", "source_hash", "use_frozen_source"]


def canonical_hash(data: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


NUMERICAL_SOURCES = ("config.py", "model", "data", "training", "curvature", "workers")
"""The modules and wings whose code decides a result's numbers (figures, collection, the campaign
planning and the command line do not)."""


def numerical_files(root: Path) -> list[Path]:
    """The source files of :data:`NUMERICAL_SOURCES` under the package directory ``root``, in order."""
    files = []
    for name in NUMERICAL_SOURCES:
        path = root / name
        files += [path] if path.is_file() else sorted(path.glob("*.py"))
    return files


@functools.cache
def source_hash() -> str:
    """SHA-256 over the sources of the numerical modules of tiny_llm (path and bytes, in order).

    Any edit of the code that computes results changes it, installed or editable, with or
    without git; edits of figures, collection, campaign planning or the command line do not.
    """
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in numerical_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def freeze_source(root: str | Path) -> Path:
    """An unchanging copy of the tiny_llm package that is running, under ``root``; its directory.

    The copy lives in ``root/<hash of every source file>/tiny_llm`` and is made once, atomically
    (copied aside, then renamed), so concurrent or repeated calls with the same code share it. A
    workflow run puts the returned directory first on ``PYTHONPATH``: every job it starts, including
    Slurm jobs that start hours later, imports this copy, whatever happens to the checkout meanwhile.
    """
    package = Path(__file__).resolve().parent
    files = sorted(path for path in package.rglob("*.py") if "__pycache__" not in path.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(root).resolve() / digest.hexdigest()[:16]
    if not (target / "tiny_llm" / "__init__.py").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".freezing-", dir=target.parent))
        try:
            for path in files:
                copy = staging / "tiny_llm" / path.relative_to(package)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, copy)
            try:
                staging.rename(target)
            except OSError:  # made meanwhile by another run with the same code
                if not (target / "tiny_llm" / "__init__.py").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def use_frozen_source(root: str | Path) -> Path:
    """Freeze the running tiny_llm under ``root`` and put the copy first on ``PYTHONPATH``, so that
    every process started from here on (Slurm jobs inherit the environment) imports it."""
    frozen = str(freeze_source(root))
    rest = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != frozen]
    os.environ["PYTHONPATH"] = os.pathsep.join([frozen, *rest])
    return Path(frozen)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def software() -> dict[str, Any]:
    """Versions of Python, torch, CUDA and the packages a result depends on, and our source hash."""
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **{name: _version(name) for name in ("numpy", "safetensors", "snakemake", "tiny-llm-curvature")},
        "tiny_llm_source": source_hash(),
    }


def hardware(device: torch.device) -> dict[str, Any]:
    """The host, its CPUs and, on CUDA, the GPU a result was computed on."""
    import torch

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_bytes=props.total_memory,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    return info


def slurm_job() -> dict[str, Any] | None:
    """The Slurm job this process runs in (id, node, GPUs, attempt), or None outside Slurm.

    ``attempt`` is the workflow's attempt (Snakemake resubmissions, via ``TINY_LLM_ATTEMPT``);
    ``restarts`` counts Slurm's own requeues of this job; ``requested`` is what the workflow asked
    for it (walltime minutes, CPUs, memory, GPUs, nodes, threads; ``TINY_LLM_REQUESTED``), or None.
    """
    if "SLURM_JOB_ID" not in os.environ:
        return None
    return {
        "job_id": os.environ["SLURM_JOB_ID"],
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "node": os.environ.get("SLURMD_NODENAME"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "account": os.environ.get("SLURM_JOB_ACCOUNT"),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "attempt": int(os.environ.get("TINY_LLM_ATTEMPT", "1")),
        "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        "requested": json.loads(os.environ.get("TINY_LLM_REQUESTED", "null")),
    }
