"""Memory measured, not modelled: the peak live storage of a pass on any device (``StoragePeak``,
the counts the memory model of :mod:`tiny_llm.curvature.memory` was fitted to), one pass measured
at a shape (``measure_pass``: the benchmarks and the GPU check), and a job's memory budget on its
device (``device_budget``).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.memory import GRADIENT, GiB, MemoryPlan, PassPlan, PassShape

__all__ = ["StoragePeak", "device_budget", "measure_pass"]


class StoragePeak(TorchDispatchMode):
    """Count the bytes of live tensor storage created inside the block, and their peak.

    Every storage that an operator returns is counted once (views share it) until it is freed.
    Storages that existed before the block (the model, the inputs, the directions) are not
    counted, nor are their views and in-place results (an output whose storage is one of the
    operator's inputs' is never new).

    Example:
        >>> with StoragePeak() as counter:
        ...     x = torch.ones(1000, dtype=torch.float64); y = x * 2; del x
        >>> counter.peak, counter.live
        (16000, 8000)
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._seen or tensor.device.type == "meta":
            return
        nbytes = storage.nbytes()
        self._seen[key] = weakref.ref(storage, lambda _, key=key, nbytes=nbytes: self._release(key, nbytes))
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage()._cdata
            for t in torch.utils._pytree.tree_leaves((args, kwargs or {}))
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor) and value.untyped_storage()._cdata not in inputs:
                self._count(value)
        return out


class _CudaPeak:
    """``torch.cuda.max_memory_allocated`` above what was allocated when the block began."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, 0

    def __enter__(self) -> _CudaPeak:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.base


def measure_pass(
    shape: PassShape,
    dtype: torch.dtype = torch.float32,
    *,
    amp: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    compile: bool = False,
) -> int:
    """Peak bytes that one pass of ``shape`` (its engine, or ``GRADIENT``, over one group of its
    rows with its K directions, the head its ``head_tokens`` target positions at a time; numbers
    of ``dtype``, not its itemsize) allocates: live storage on CPU (:class:`StoragePeak`), the
    allocator's peak on CUDA. The parameters and the directions themselves are not included (they
    are part of :func:`tiny_llm.curvature.memory.resident_bytes`)."""
    from tiny_llm.architectures import build_model
    from tiny_llm.curvature.hessian import Precision
    from tiny_llm.curvature.job import Cuts, open_job
    from tiny_llm.model.micro_batch import accumulate_batch_gradient

    config, engine, rows, K = shape.config, shape.engine, shape.rows, shape.K
    seq_len, head_tokens = shape.seq_len, shape.head_tokens
    device = torch.device(device)
    counter = _CudaPeak(device) if device.type == "cuda" else StoragePeak()
    torch.manual_seed(seed)
    model = build_model(config, attention_backend="reference").to(device, dtype)
    precision = Precision(device, dtype, amp)
    tokens = torch.randint(0, config.vocab_size, (rows, seq_len + 1), device=device)
    if engine == GRADIENT:
        with counter:
            accumulate_batch_gradient(model, tokens, rows, precision, head_tokens)
        return counter.peak
    cuts = Cuts(rows, rows, K, compile, _one_pass(shape))
    H = open_job(model, [tokens], cuts, precision).operator(engine)
    V = torch.randn(K, H.flat.D, dtype=dtype, device=device)
    if engine_named(engine).products:
        if compile:  # compilation's own workspaces are not the pass's
            H.hvp(V)
        with counter:
            H.hvp(V)
        return counter.peak
    inputs, targets = H.batches[0]
    with counter:  # one group of ``rows`` sequences (whatever the engine's default grouping), twice: the
        for _ in range(2):  # jet engines keep their workspace between groups, the second is the steady state
            H.spec.compute()(H.context, V, inputs, targets)  # the engine's batch computation, as the operator runs it
    return counter.peak


def _one_pass(shape: PassShape) -> MemoryPlan:
    """The plan of the one forms or products pass a measurement runs: one group of the pass's rows,
    the head ``shape.head_tokens`` target positions at a time."""
    forms = PassPlan("forms", shape.engine, shape.K, shape.rows, shape.rows, 0, shape.head_tokens)
    return MemoryPlan(None, (forms,))


def device_budget(device: torch.device, setting_gb: float | None, margin: float = 0.1) -> int | None:
    """The memory budget of a job in bytes: ``setting_gb`` when given; on CUDA by default the
    device's free memory less a margin (10 %, at least 2 GiB, for the allocator's fragmentation
    and the compiled kernels' workspaces); elsewhere None (no budget)."""
    if setting_gb is not None:
        return int(setting_gb * GiB)
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free - max(margin * total, 2 * GiB))
