"""The calibration job: a timing entry measured on the node that will run an analysis (the
per-micro-batch seconds :mod:`tiny_llm.campaign.timing` keys and looks up), in a fresh process so
that its start-up is the one a job pays.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from typing import Any

import torch

from tiny_llm.architectures import build_model
from tiny_llm.campaign.timing import timing_key
from tiny_llm.config import RunConfig
from tiny_llm.curvature.gradients import batch_gradient
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision, runtime_settings
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.curvature.memory_measure import device_budget
from tiny_llm.workers.loading import Resolved, memory_plan, resolve_job
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.state import explain_out_of_memory

__all__ = ["calibrate"]


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats


def calibrate(config: RunConfig, settings: AnalysisSettings, repeats: int = 3) -> dict[str, Any]:
    """Measure the per-micro-batch costs of this setup on this machine (random weights and tokens
    of the right shapes); returns a timing entry ``{"key", "seconds", "measured"}``.

    It measures under the runtime settings the analysis runs with (TF32 or not), recorded in
    ``measured.runtime``, with the passes cut into the groups of sequences that the analysis's
    memory budget gives them (``measured.memory``).

    Raises:
        ValueError: the setup does not fit the device's memory, naming the settings to lower.
    """
    resolved = resolve_job(settings, config)
    memory = memory_plan(
        settings, config, device_budget(resolved.device, settings.memory_budget_gb), cuda=resolved.device.type == "cuda"
    )
    with (
        runtime_settings(resolved.device, resolved.tf32) as runtime,
        explain_out_of_memory(resolved.hvp_batch_size, settings.directions_per_pass),
    ):
        seconds = _measure_seconds(config, settings, resolved, repeats, memory)
    device_kind = "cpu" if resolved.device.type == "cpu" else f"cuda:{torch.cuda.get_device_name(resolved.device)}"
    return {
        "key": timing_key(config, settings, device_kind),
        "seconds": seconds,
        "measured": {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "repeats": repeats,
            "host": socket.gethostname(),
            "runtime": runtime,
            "memory": memory.record(),
        },
    }


def _measure_seconds(
    config: RunConfig, settings: AnalysisSettings, resolved: Resolved, repeats: int, memory: MemoryPlan
) -> dict[str, float]:
    precision = Precision(resolved.device, resolved.dtype, settings.amp)
    started = time.perf_counter()
    model = build_model(config.model, attention_backend="reference").to(resolved.device, resolved.dtype)
    B, T, mb, hvp_rows = (
        config.training.batch_size,
        config.data.seq_len,
        config.training.micro_batch_size,
        resolved.hvp_batch_size,
    )
    tokens = torch.randint(
        0, config.model.vocab_size, (max(B, hvp_rows), T + 1), generator=torch.Generator().manual_seed(0)
    )
    flat = FlatParameters(model)
    operator = EpochHessian(
        model,
        tokens[:hvp_rows],
        batch_size=hvp_rows,
        engine=resolved.engine,
        precision=precision,
        directions_per_pass=settings.directions_per_pass,
        compile=resolved.compiled,
        group_rows=memory.rows("forms"),
        head_tokens=memory.head_tokens("forms"),
    )
    V = torch.randn(settings.directions_per_pass, flat.D, device=resolved.device, dtype=resolved.dtype)
    operator.quadratic_forms(V)  # compilation happens here and counts as start-up
    startup = time.perf_counter() - started
    hvp = _timed(lambda: operator.quadratic_forms(V), resolved.device, repeats)
    micro = math.ceil(B / mb)
    rows = memory.rows("gradient") or mb  # the analysis's backward passes, as cut for its memory budget
    head = memory.head_tokens("gradient")
    gradient = (
        _timed(lambda: batch_gradient(model, flat, tokens[:B], rows, precision, head), resolved.device, repeats) / micro
    )
    seconds = {
        "process": _process_seconds(),
        "startup": startup,
        "gradient_microbatch": gradient,
        "hvp_microbatch_pass": hvp,
    }
    if settings.audited:  # the audit's float64 gradients and adjoint forms of its 2a + 1 directions
        exact = Precision(resolved.device, torch.float64)
        reference = model.to(torch.float64)
        rows64, head64 = memory.rows("audit_gradient") or mb, memory.head_tokens("audit_gradient")
        seconds["audit_gradient_microbatch"] = (
            _timed(lambda: batch_gradient(reference, flat, tokens[:B], rows64, exact, head64), resolved.device, repeats)
            / micro
        )
        audit = EpochHessian(
            reference,
            tokens[:hvp_rows],
            batch_size=hvp_rows,
            engine="adjoint",
            precision=exact,
            directions_per_pass=2 * settings.audit_directions + 1,
            group_rows=memory.rows("audit"),
            head_tokens=memory.head_tokens("audit"),
        )
        V64 = torch.randn(2 * settings.audit_directions + 1, flat.D, device=resolved.device, dtype=torch.float64)
        seconds["audit_microbatch_pass"] = _timed(lambda: audit.quadratic_forms(V64), resolved.device, repeats)
    return seconds


def _process_seconds() -> float:
    """A job's own start: a new interpreter importing torch and the analysis code (not counted
    by the measurements in this process, which has them loaded)."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, tiny_llm.workers.state"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    return time.perf_counter() - started
