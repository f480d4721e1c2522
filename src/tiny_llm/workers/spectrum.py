"""The spectrum worker: Lanczos top eigenpairs, SLQ density, gradient/noise alignment with the top
eigenvectors, a damped CG solve and block-diagonal errors for one (state, case) → one JSON.

It reuses the noise worker's checks, identity, lock and atomic write, and the same full-epoch
operator (``EpochHessian``) with the analysis settings' engine, dtype and device.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from tiny_llm.architectures import build_model
from tiny_llm.config import RunConfig
from tiny_llm.curvature.context import FD_SCALE
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.hessian import FlatParameters, Precision, runtime_settings
from tiny_llm.curvature.memory import JobShape, MemoryPlan, plan_spectrum
from tiny_llm.curvature.memory_measure import device_budget
from tiny_llm.curvature.placement import held_shards, hold
from tiny_llm.distributed import record as parallel_record
from tiny_llm.distributed import single_writer
from tiny_llm.io import atomic_write_json, check_writable_file
from tiny_llm.provenance import canonical_hash, hardware, slurm_job, software
from tiny_llm.workers.loading import LoadedState, Resolved, prepare_inputs, step_vector
from tiny_llm.workers.preconditioning import load_preconditioning
from tiny_llm.workers.results import (
    check_same_batches,
    check_successor,
    result_identity,
    reusable_result,
)
from tiny_llm.workers.settings import (
    AnalysisSettings,
    SpectrumSettings,
    settings_record,
    sharded_engine,
    spectrum_settings_from_dict,
)
from tiny_llm.workers.spectral import BASIS_DTYPES, SpectrumJob, lanczos_tolerance, measure_spectrum
from tiny_llm.workers.state import explain_out_of_memory

__all__ = ["SpectrumSettings", "analyze_spectrum", "lanczos_tolerance", "sharded_engine", "spectrum_settings_from_dict"]

log = logging.getLogger(__name__)


def _steps(resolved: Resolved) -> dict[str, Any]:
    """The finite-difference step's relative scale (ε = scale · max(1, ‖θ‖) / ‖v‖), when that engine runs."""
    if engine_named(resolved.hvp_engine).second_derivatives:
        return {}
    return {"finite_difference_scale": FD_SCALE.get(resolved.dtype, 3e-3)}


def spectrum_memory(
    settings: AnalysisSettings,
    spectrum: SpectrumSettings,
    config: RunConfig,
    resolved: Resolved,
    n_batches: int,
    ranks: int | None = None,
) -> MemoryPlan:
    """The grouping of a spectrum job's passes under its memory budget (see ``memory_budget_gb``);
    sharded over ``ranks`` (default: this job's), each rank holds 1/ranks of every
    parameter-sized vector and of the Lanczos basis.

    Raises:
        ValueError: a pass that does not fit even one sequence at a time (nothing is computed).
    """
    job = JobShape(
        config=config.model,
        seq_len=config.data.seq_len,
        engine=resolved.hvp_engine,
        shards=held_shards(spectrum.sharded) if ranks is None else (ranks if spectrum.sharded else 1),
        K=min(settings.directions_per_pass, max(spectrum.block_samples, 1)),
        hvp_batch_size=resolved.hvp_batch_size,
        micro_batch_size=config.training.micro_batch_size,
        itemsize=torch.finfo(resolved.dtype).bits // 8,
        compiled=resolved.hvp_compiled,
    )
    basis = spectrum.lanczos_steps * job.held * torch.finfo(BASIS_DTYPES[spectrum.lanczos_basis]).bits // 8
    noise = n_batches if settings.noise_samples is None else min(settings.noise_samples, n_batches)
    preconditioned = 2 if settings.preconditioned is not False else 0  # P and P^{1/2}
    return plan_spectrum(
        job,
        basis_bytes=basis,
        extra_vectors=noise + preconditioned,
        budget_bytes=device_budget(resolved.device, settings.memory_budget_gb),
    )


def _result(
    identity: dict, state: LoadedState, case: str, job: SpectrumJob, resolved: Resolved, measured: dict, sharded: bool
) -> dict[str, Any]:
    """The spectrum result JSON: identity, state, settings and precision (with the runtime settings
    in force), the measurement, memory, and what ran where."""
    settings, spectrum = job.settings, job.spectrum
    return {
        "schema": 1,
        "kind": "spectrum",
        "identity": identity,
        "state": {"key": state.key, "weights_hash": state.weights_hash, "aliases": state.aliases},
        "case": case,
        "settings": settings_record(settings),
        "spectrum_settings": asdict(spectrum),
        "precision": {
            "device": str(resolved.device),
            "dtype": settings.dtype,
            "engine": resolved.hvp_engine,
            "lanczos_basis": spectrum.lanczos_basis,
            "lanczos_reduction": spectrum.lanczos_reduction,
            **_steps(resolved),
            "cuda_matmul_fp32_precision": measured.pop("cuda_matmul_fp32_precision"),
        },
        **measured,
        "memory": job.memory.record(),
        "software": software(),
        "hardware": hardware(resolved.device),
        "parallel": {**parallel_record(), "sharded": sharded},
        "slurm": slurm_job(),
    }


def _job(settings: AnalysisSettings, spectrum: SpectrumSettings, resolved: tuple, names: list[str], rows: Any,
         given: tuple) -> SpectrumJob:  # fmt: skip
    """The spectrum job of a state: its precision, products engine and cuts, its step to the
    following state and its preconditioner, each as ``rows`` holds vectors (``resolved``: the run's
    configuration, the resolution and the memory plan; ``given``: the state, the following one and
    the preconditioning found)."""
    (config, resolution, memory), (state, following, found) = resolved, given
    step = step_vector(state, following, names, rows)
    P = None if found is None or found.diagonal is None else rows.cut([found.diagonal[n] for n in names])
    precision = Precision(resolution.device, resolution.dtype, settings.amp)
    hvp = (resolution.hvp_batch_size, resolution.hvp_engine, resolution.hvp_compiled)
    shape = (config.training.micro_batch_size, memory, step, P, _following(spectrum, found))
    return SpectrumJob(settings, spectrum, precision, *hvp, *shape)


def analyze_spectrum(
    run_dir: str | Path,
    checkpoints: list[str],
    case: str,
    settings: AnalysisSettings,
    spectrum: SpectrumSettings,
    output: str | Path,
    expect_key: str | None = None,
    successor: dict[str, Any] | None = None,
    order: dict[str, Any] | None = None,
) -> dict[str, Any]:  # 9 parameters: the worker's command line (one a flag), as the workflow's rule passes it
    """Measure one state's spectrum on one case and write the JSON atomically (reused when identical).
    ``successor``: the next state of the analysis (``{"key", "file", "step"}``), whose step Δ's share
    in the top eigenspace is measured too; None: none. ``order``: a case of a published training
    order (as :func:`tiny_llm.workers.state.analyze_state` takes it) instead of the run's cache.

    Raises:
        ValueError: bad inputs (as the noise worker), before anything is computed or written.
    """
    output = Path(output)
    check_writable_file(output)
    if settings.sharded:  # the analysis's switch shards its spectra too
        spectrum = replace(spectrum, sharded=True)
    prepared = prepare_inputs(run_dir, checkpoints, case, settings, expect_key, order, successor)
    config, resolved, cache, plan, state, following = prepared
    if (engine := sharded_engine(settings, spectrum)) is not None:
        resolved = replace(resolved, hvp_engine=engine, hvp_compiled=False)
    identity = _identity(result_identity(settings, resolved, config, cache), spectrum)
    memory = spectrum_memory(settings, spectrum, config, resolved, len(plan))
    found = load_preconditioning(run_dir, state, config, settings.preconditioned)
    with single_writer(output) as writer:  # every rank computes, rank 0 writes
        if (old := writer.reuse(lambda: reusable_result(output, identity, state.key, case))) is not None:
            check_successor(old, successor, output)
            check_same_batches(old.get("plan", plan.name), plan.name, output)
            return old
        model = build_model(config.model, attention_backend="reference")
        model.load_state_dict(state.root, strict=True)
        rows = hold(model, spectrum.sharded, resolved.device, resolved.dtype)  # this rank's, as every vector
        names, given = FlatParameters(model).names, (state, following, found)
        job = _job(settings, spectrum, (config, resolved, memory), names, rows, given)
        batches = [cache.tokens(blocks) for blocks in plan.blocks]
        with (
            runtime_settings(resolved.device, resolved.tf32) as runtime,
            explain_out_of_memory(resolved.hvp_batch_size, settings.directions_per_pass),
        ):
            measured = measure_spectrum(model, batches, job)
        result = _result(identity, state, case, job, resolved, measured | runtime, rows.sharded)
        result["trajectory"] = None if successor is None else {"successor": successor}
        result["preconditioner"] = None if found is None else {**found.record, "timing": spectrum.preconditioner}
        result["plan"] = plan.name
        writer.write(lambda: atomic_write_json(output, result))
    return result


def _identity(analysis: dict[str, Any], spectrum: SpectrumSettings) -> dict[str, Any]:
    """A spectrum result's identity: the analysis's and the spectral settings, hashed; the default
    ``preconditioner: applied`` left out, so results from before that setting stay valid."""
    identity = {k: v for k, v in analysis.items() if k != "hash"} | {"spectrum": asdict(spectrum)}
    if spectrum.preconditioner == "applied":
        del identity["spectrum"]["preconditioner"]
    return identity | {"hash": canonical_hash(identity)}


def _following(spectrum: SpectrumSettings, found: Any) -> dict[str, Any] | None:
    """Adam's step, β2 and ε for the P of its next step (``spectrum.preconditioner: next``), None
    for the applied P, SGD's P = I or no preconditioner."""
    record = {} if found is None or found.diagonal is None else found.record
    if spectrum.preconditioner != "next" or record.get("optimizer") != "adamw":
        return None
    return {"step": record["step"], "beta2": record["beta2"], "eps": record["eps"]}
