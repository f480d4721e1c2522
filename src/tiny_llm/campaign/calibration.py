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
from tiny_llm.curvature.hessian import Precision, runtime_settings
from tiny_llm.curvature.job import Cuts, Job, open_job
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


def _audit_seconds(job: Job, K: int, device: torch.device, repeats: int) -> dict:
    """The audit's float64 gradient micro-batch and its forms' pass of K = 2a + 1 directions, by the
    engine the audit resolves for the model under its placement (``Placement.forms_engine``), on
    ``job``'s model made float64 in place (the production's timings are taken), cut as the memory
    plan's audit passes."""
    job.model.to(torch.float64)  # in place: the placement holds the same parameters
    audit = job.reference(job.placement)
    micro = math.ceil(len(job.batches[0]) / job.cuts.micro_batch_size)
    forms = audit.operator(audit.placement.forms_engine(K), job.batches[1], K)
    V = torch.randn(K, sum(job.placement.sizes), device=device, dtype=torch.float64)
    return {
        "audit_gradient_microbatch": _timed(lambda: audit.batch_gradient_and_loss(0), device, repeats) / micro,
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
    cuts = Cuts(mb, hvp_rows, settings.directions_per_pass, resolved.compiled, memory)
    job = open_job(model, [tokens[:B], tokens[:hvp_rows]], cuts, precision)  # an optimizer batch, a curvature one
    operator = job.operator(resolved.engine, job.batches[1])
    K, held = settings.directions_per_pass, sum(job.placement.sizes)
    V = torch.randn(K, held, device=resolved.device, dtype=resolved.dtype)
    operator.quadratic_forms(V)  # compilation happens here and counts as start-up
    startup = time.perf_counter() - started
    hvp = _timed(lambda: operator.quadratic_forms(V), resolved.device, repeats)
    gradient = _timed(lambda: job.batch_gradient_and_loss(0), resolved.device, repeats) / math.ceil(B / mb)
    seconds = {
        "process": _process_seconds(),
        "startup": startup,
        "gradient_microbatch": gradient,
        "hvp_microbatch_pass": hvp,
    }
    if settings.audited:
        seconds |= _audit_seconds(job, 2 * settings.audit_directions + 1, resolved.device, repeats)
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
