"""The runtime of a job: the device it asked for, and a private, disposable torch.compile cache."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["compile_cache_base", "node_local_compile_cache", "resolve_device"]

def resolve_device(name: str) -> "torch.device":
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


_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def compile_cache_base() -> Path:
    """``$SLURM_TMPDIR``, else ``$TMPDIR``, else ``/tmp``: the node's scratch space."""
    for variable in ("SLURM_TMPDIR", "TMPDIR"):
        if os.environ.get(variable):
            return Path(os.environ[variable])
    return Path("/tmp")


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def node_local_compile_cache() -> Iterator[Path]:
    """Point the inductor and Triton caches at a directory unique to this job, removed on normal
    exit, on failure and on catchable termination (SIGTERM, SIGHUP, SIGINT become SystemExit so
    the cleanup runs). SIGKILL or a node failure leave it to the node's own scratch cleanup.

    Example:
        >>> with node_local_compile_cache() as path:
        ...     os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
        True
        >>> path.exists()
        False
    """
    job = os.environ.get("SLURM_JOB_ID", "local")
    path = Path(tempfile.mkdtemp(prefix=f"tiny-llm-compile-{job}-", dir=compile_cache_base()))
    saved_env = {name: os.environ.get(name) for name in _CACHE_VARIABLES}
    saved_handlers = {}
    for sig in _SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread
            saved_handlers[sig] = signal.signal(sig, _terminate)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
