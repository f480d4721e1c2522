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
from dataclasses import dataclass
from typing import Any

import torch

from tiny_llm.architectures import build_model, jet_rules
from tiny_llm.campaign.timing import timing_key
from tiny_llm.config import RunConfig
from tiny_llm.curvature.engines import default_forms_engine
from tiny_llm.curvature.gradients import batch_gradient
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision, runtime_settings
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.workers.loading import Resolved, job_memory_plan, resolve_job
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
    memory = job_memory_plan(settings, config, resolved)
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


@dataclass(frozen=True)
class _Audit:
    """What the audit's timing measures: the float64 model, its tokens and the plan of its passes."""

    reference: torch.nn.Module
    flat: FlatParameters
    tokens: torch.Tensor
    hvp_rows: int
    """The curvature micro-batch."""
    directions: int
    """a: the audit's noise and random directions (each)."""
    memory: MemoryPlan


def _audit_seconds(audit: _Audit, config: RunConfig, device: torch.device, repeats: int) -> dict[str, float]:
    """The audit's float64 gradient micro-batch and its forms' pass of 2a + 1 directions, by the
    engine the audit resolves for the model (adjoint, or double_backward without jet rules)."""
    exact = Precision(device, torch.float64)
    B, mb, memory = config.training.batch_size, config.training.micro_batch_size, audit.memory
    rows, head = memory.rows("audit_gradient") or mb, memory.head_tokens("audit_gradient")
    gradient = _timed(
        lambda: batch_gradient(audit.reference, audit.flat, audit.tokens[:B], rows, exact, head), device, repeats
    )
    K = 2 * audit.directions + 1
    forms = EpochHessian(
        audit.reference,
        audit.tokens[: audit.hvp_rows],
        batch_size=audit.hvp_rows,
        engine=default_forms_engine(K, jet_rules(config.model)),
        precision=exact,
        directions_per_pass=K,
        **memory.cuts("audit"),
    )
    V = torch.randn(K, audit.flat.D, device=device, dtype=torch.float64)
    return {
        "audit_gradient_microbatch": gradient / math.ceil(B / mb),
        "audit_microbatch_pass": _timed(lambda: forms.quadratic_forms(V), device, repeats),
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
        **memory.cuts("forms"),
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
    if settings.audited:
        audit = _Audit(model.to(torch.float64), flat, tokens, hvp_rows, settings.audit_directions, memory)
        seconds |= _audit_seconds(audit, config, resolved.device, repeats)
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
