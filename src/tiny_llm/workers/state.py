"""The analysis worker: one parameter state × one data case → one atomic result JSON.

``analyze_state(run_dir, checkpoints, case, settings, output)`` checks everything before any
compute (root checkpoints only, identical aliases, strict names/shapes, finite weights, packed
workers present and consistent with the saved average, cache capacity, precision options), runs
``noise.measure_case`` and writes the result (keys listed in the README) atomically. An existing
result with the same identity is reused; one with another identity is refused. Its settings live in
:mod:`~tiny_llm.workers.settings`, its checks in :mod:`~tiny_llm.workers.loading`, the identity and
the single writer in :mod:`~tiny_llm.workers.binding`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tiny_llm.architectures import build_model, jet_rules
from tiny_llm.config import RunConfig
from tiny_llm.curvature.blocks import check_block_layout
from tiny_llm.curvature.context import FD_SCALE
from tiny_llm.curvature.engines import FINITE_DIFFERENCE
from tiny_llm.curvature.gradients import gradient_rounding
from tiny_llm.curvature.hessian import FlatParameters, Precision, runtime_settings
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.placement import hold
from tiny_llm.data.order import order_report
from tiny_llm.data.tokens import TokenCache
from tiny_llm.data.training_order import TrainingOrder
from tiny_llm.distributed import record as parallel_record
from tiny_llm.distributed import single_writer
from tiny_llm.io import atomic_write_json, check_writable_file
from tiny_llm.provenance import hardware, slurm_job, software
from tiny_llm.runtime import compile_record
from tiny_llm.workers.loading import (
    LoadedState,
    Resolved,
    job_memory_plan,
    prepare_inputs,
    step_vector,
)
from tiny_llm.workers.preconditioning import Preconditioning, load_preconditioning
from tiny_llm.workers.results import (
    check_same_batches,
    check_successor,
    result_identity,
    reusable_result,
)
from tiny_llm.workers.settings import AnalysisSettings, settings_record

__all__ = ["RESULT_SCHEMA", "analyze_state", "explain_out_of_memory"]

log = logging.getLogger(__name__)
RESULT_SCHEMA = 1


def analyze_state(
    run_dir: str | Path,
    checkpoints: list[str],
    case: str,
    settings: AnalysisSettings,
    output: str | Path,
    expect_key: str | None = None,
    order: dict[str, Any] | None = None,
    successor: dict[str, Any] | None = None,
) -> dict[str, Any]:  # 8 parameters: the worker's command line (one a flag), as the workflow's rule passes it
    """Measure one state on one case and write the result JSON atomically; returns the result.
    ``order``: a case of a published training order (:class:`tiny_llm.data.training_order.OrderCase`
    as plain data: the order and the case's window of steps) instead of the run's token cache.
    ``successor``: the next state of the analysis (``{"key", "file", "step"}``), for the trajectory
    statistics along the step to it; None: none.

    Raises:
        ValueError: any bad input (see module docstring); nothing is written.
    """
    output = Path(output)
    check_writable_file(output)
    if successor is not None and not settings.trajectory:
        raise ValueError(
            f"successor {successor.get('file')}: given with the trajectory statistics off (--no-trajectory, "
            "settings.trajectory: false), which measure the step to it; drop one of the two"
        )
    prepared = prepare_inputs(run_dir, checkpoints, case, settings, expect_key, order, successor)
    config, resolved, cache, plan, state, following = prepared
    identity = result_identity(settings, resolved, config, cache)
    memory = job_memory_plan(settings, config, resolved)
    found = load_preconditioning(run_dir, state, config, settings.preconditioned)
    with single_writer(output) as writer:
        if (old := writer.reuse(lambda: reusable_result(output, identity, state.key, case))) is not None:
            check_same_batches(old["data"].get("plan"), plan.name, output)
            check_successor(old, successor, output)
            log.info("reusing %s (same identity)", output)
            return old
        log.info("%s", memory.describe())
        job = StateJob(config, cache, plan, state, case, settings, resolved, identity, memory, following, found)
        result = _measure(job)
        writer.write(lambda: atomic_write_json(output, result))
    return result


@contextlib.contextmanager
def explain_out_of_memory(hvp_batch_size: int, directions_per_pass: int) -> Iterator[None]:
    """Turn the device running out of memory into the one-line error that names the settings to
    lower (nothing is shrunk silently; the caller has written nothing yet).

    Raises:
        ValueError: on ``torch.OutOfMemoryError`` inside the block.
    """
    try:
        yield
    except torch.OutOfMemoryError:
        raise ValueError(
            f"out of memory with --hvp-batch-size {hvp_batch_size} and --directions-per-pass "
            f"{directions_per_pass} although the memory model said they fit; set a smaller "
            "memory_budget_gb (--memory-budget-gb) so that the passes are cut finer, or lower "
            f"them (e.g. {max(1, hvp_batch_size // 2)} and {max(1, directions_per_pass // 2)}); "
            "nothing was written"
        ) from None


@dataclass(frozen=True)
class StateJob:
    """One (state, case) job, resolved and checked before any compute."""

    config: RunConfig
    cache: TokenCache | TrainingOrder
    """Where the case's tokens come from: the run's token cache, or a published training order."""
    plan: Any
    """The case's batch plan (``tiny_llm.data.tokens.BatchPlan``)."""
    state: LoadedState
    case: str
    settings: AnalysisSettings
    resolved: Resolved
    identity: dict
    memory: MemoryPlan
    successor: tuple[dict[str, Any], LoadedState] | None = None
    """The next state (as the planner named it, and loaded), for the trajectory statistics."""
    preconditioning: Preconditioning | None = None
    """The optimizer's preconditioner at the state (or why it has none); None: not asked for."""

    @property
    def label(self) -> str:
        """How its log lines name it."""
        return f"[{self.state.key[:12]} {self.case}]"


def _precision_record(job: StateJob, measured: dict[str, Any]) -> dict[str, Any]:
    """The result's precision: the numerical mode actually used, what stayed below float64 in a
    float64 analysis, and the step regime of forms by finite differences."""
    settings, resolved = job.settings, job.resolved
    return {
        "device": str(resolved.device),
        "dtype": settings.dtype,
        "tf32": resolved.tf32,
        "amp": settings.amp,
        "amp_dtype": "bfloat16" if settings.amp else None,
        "engine": resolved.engine,
        "quadratic_form_engine": resolved.engine,
        "compiled": resolved.compiled,
        "attention_backend": "reference",
        "reductions": "float64",
        "cuda_matmul_fp32_precision": measured["cuda_matmul_fp32_precision"],
        "below_float64": measured["below_float64"],
        "gradient_rounding": measured["gradient_rounding"],
        # the step regime of forms by finite differences (the fallback of sharded analyses)
        **(
            {"finite_difference_scale": FD_SCALE.get(resolved.dtype, 3e-3)}
            if resolved.engine == FINITE_DIFFERENCE
            else {}
        ),
    }


def _data_record(job: StateJob) -> dict[str, Any]:
    """The result's data: the cache, its tokenizer and shards, and where the case's batches lie; or
    the training order and the case's window of steps, its sequences and tokens."""
    cache, plan = job.cache, job.plan
    if isinstance(cache, TrainingOrder):
        first, last = int(plan.stream_batches[0]), int(plan.stream_batches[-1])  # the steps that trained them
        sequences = int(plan.blocks.size)
        return {
            "training_order": cache.describe(),
            "window": {"first_step": first, "last_step": last, "steps": last - first + 1},
            "sequences": sequences,
            "tokens": sequences * (cache.sequence_tokens - 1),
            "plan": plan.name,
            "batch_sequences": int(plan.blocks.shape[1]),
            "stream_batches": [int(plan.stream_batches[0]), int(plan.stream_batches[-1])],
            "seq_len": job.config.data.seq_len,
        }
    return {
        "cache": str(cache.path),
        "tokenizer": cache.meta["tokenizer"],
        "source": cache.meta["source"],
        "shards": [{"file": s["file"], "sha256": s["sha256"]} for s in cache.meta["shards"]],
        "plan": plan.name,
        "stream_batches": [int(plan.stream_batches[0]), int(plan.stream_batches[-1])],
        "seq_len": job.config.data.seq_len,
        "order": order_report(cache, plan),
    }


def _training_batch(job: StateJob) -> int:
    """Sequences of one optimizer step's batch in the training the case is taken from (the noise
    batches may be smaller: ``effective_batch_size``)."""
    if isinstance(job.cache, TrainingOrder):
        return job.cache.spec.sequences_per_step
    return job.config.training.batch_size


def _result(job: StateJob, measured: dict[str, Any], started: float, sharded: bool) -> dict[str, Any]:
    """The result JSON of a (state, case): identity, state, settings and precision, the measurement
    (with the runtime settings in force, ``cuda_matmul_fp32_precision``), the data it was measured
    on, and what ran where."""
    state = job.state
    return {
        "schema": RESULT_SCHEMA,
        "identity": job.identity,
        "state": {
            "key": state.key,
            "weights_hash": state.weights_hash,
            "aliases": state.aliases,
            "worker_hashes": state.worker_hashes or None,
            "worker_files": state.worker_files or None,
        },
        "case": job.case,
        "settings": settings_record(job.settings),
        "precision": _precision_record(job, measured),
        "timing": {**measured["timing"], "wall_seconds": time.perf_counter() - started, "compile": compile_record()},
        "memory": job.memory.record(),
        **{key: measured[key] for key in MEASURED},
        "counts": {**measured["counts"], "training_batch_size": _training_batch(job)},
        "trajectory": None if job.successor is None else {**measured["trajectory"], "successor": job.successor[0]},
        "preconditioner": None if job.preconditioning is None else job.preconditioning.record,
        "preconditioned": measured["preconditioned"],
        "data": _data_record(job),
        "software": software(),
        "hardware": hardware(job.resolved.device),
        "parallel": {**parallel_record(), "sharded": sharded},
        "slurm": slurm_job(),
    }


MEASURED = (
    "counts",
    "measurement_plan",
    "statistics",
    "standard_errors",
    "blocks",
    "audit",
    "noise_samples",
    "random_directions",
    "consensus",
)
"""What a result holds from the measurement as it came (``measure_case``), in this order."""


def _case_inputs(
    job: StateJob, consensus: list, step: torch.Tensor | None, preconditioner: torch.Tensor | None
) -> CaseInputs:
    """What ``measure_case`` is given for the job."""
    config, settings, resolved = job.config, job.settings, job.resolved
    return CaseInputs.of(
        settings,
        cache=job.cache,
        plan=job.plan,
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=resolved.hvp_batch_size,
        engine=resolved.engine,
        compile=resolved.compiled,
        workers=config.training.workers,
        consensus=consensus,
        audit=(settings.audit_directions, settings.audit_batches) if settings.audited else None,
        memory=job.memory,
        step=step,
        preconditioner=preconditioner,
    )


def _measure(job: StateJob) -> dict[str, Any]:
    started = time.perf_counter()
    settings, resolved, state = job.settings, job.resolved, job.state
    precision = Precision(resolved.device, resolved.dtype, settings.amp)
    model = build_model(job.config.model, attention_backend="reference")
    model.load_state_dict(state.root, strict=True)
    rows = hold(model, settings.sharded, resolved.device, resolved.dtype)  # this rank's, as every vector
    names = FlatParameters(model).names
    if settings.block_curvature:
        check_block_layout(names)
    consensus = [
        (w, rows.cut([worker[n].double() - state.root[n].double() for n in names]))
        for w, worker in enumerate(state.workers)
    ]
    step = step_vector(state, job.successor, names, rows)
    P = None if job.preconditioning is None else job.preconditioning.diagonal
    inputs = _case_inputs(job, consensus, step, None if P is None else rows.cut([P[n] for n in names]))
    with (
        runtime_settings(resolved.device, resolved.tf32) as runtime,
        explain_out_of_memory(resolved.hvp_batch_size, settings.directions_per_pass),
    ):
        measured = measure_case(model, inputs, precision, progress=lambda m: log.info("%s %s", job.label, m))
    measured |= _below_float64(job, model, precision)
    return _result(job, measured | runtime, started, rows.sharded)


def _below_float64(job: StateJob, model: torch.nn.Module, precision: Precision) -> dict[str, Any]:
    """What a model without our rules (an adapter's) still computed below a float64 analysis's
    dtype, and the precision floor it sets, measured once on the first micro-batch (a sharded one
    never gets here: its only engine, finite differences, refuses such a model before it measures,
    since it would divide that rounding by its step)."""
    below = sorted(model.lowered) if not jet_rules(model) else []
    if not below:
        return {"below_float64": below, "gradient_rounding": None}
    first = job.cache.tokens(job.plan.blocks[0])[: job.config.training.micro_batch_size].to(job.resolved.device)
    rounding = gradient_rounding(model, first, precision, job.settings.seed)
    log.warning(
        "%s this model computes %s below float64: its gradients are rounded to about %.1e (relative), "
        "and no statistic is more exact than that",
        job.label,
        ", ".join(below),
        rounding,
    )
    return {"below_float64": below, "gradient_rounding": rounding}
