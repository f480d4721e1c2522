"""What an analysis will cost before it runs: states × cases × passes × micro-batches, time and walltime.

The counts come from the run configuration and the analysis settings alone, so they are known
before training has written a checkpoint. The time is the same estimate the cluster walltime
uses (measured per-micro-batch seconds of a timing entry, scaled to these counts); without a
timing entry for the setup only the counts are given. A job's walltime is 2 × estimated work + 30
minutes, rounded up to the hour, and at most 72 hours.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from tiny_llm.config import RunConfig
from tiny_llm.curvature.blocks import block_count
from tiny_llm.curvature.measurement import MeasurementPlan
from tiny_llm.declared import Bounds, Positive, PositiveNumber, build
from tiny_llm.layout import FINAL, IMPORTED, STATES
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

__all__ = [
    "MAX_HOURS",
    "ClusterSettings",
    "PARALLEL_EFFICIENCY",
    "CaseWork",
    "case_work",
    "Jobs",
    "cost_line",
    "estimate_seconds",
    "expected_states",
    "format_seconds",
    "job_minutes",
    "parallel_seconds",
]

MAX_HOURS = 72
"""The partition's walltime limit."""
PARALLEL_EFFICIENCY = 0.6
"""Speed-up each rank beyond the first adds to a job's passes: the lowest of the measured 1.60–1.74×
(quadratic forms) and 1.67–1.88× (Hessian-vector products) at 2 ranks, one thread per rank
(benchmarks/distributed.py), so that walltimes err long."""


@dataclass(frozen=True)
class ClusterSettings:
    """The workflow configuration's ``cluster`` section, typed (defaults as the schema's)."""

    walltime: Literal["none", "estimate"] = "none"
    """estimate: each job's walltime is 2 × its estimated work + 30 min, rounded up to the hour, from
    the timing profiles (docs/cluster.md); none: the profile's default."""
    walltime_hours: Annotated[float, Bounds(0, MAX_HOURS, open_low=True)] | None = None
    """An explicit walltime per state (both cases) in hours, at most the partition's 72; overrides the
    estimate."""
    timing_profiles: tuple[str, ...] = ("config/timing.yaml", "results/timing")
    """Timing profile files or folders (calibrate writes results/timing/<analysis>.json)."""
    gpu_kind: str | None = None
    """Only use timings measured on a device whose name contains this (e.g. GH200)."""
    on_interrupt: Literal["keep-running", "cancel"] = "keep-running"
    """Ctrl-C cancels queued Slurm jobs only and leaves running ones to be re-attached by the next run
    (keep-running), or cancels all (cancel)."""
    reattach_poll_seconds: PositiveNumber = 30
    """How often a re-attached job of an earlier controller is polled with squeue (seconds)."""
    gpus_per_node: Positive | None = None
    """GPUs on one node of the cluster (profiles/naiss sets 4): an analysis's gpus_per_job above it is
    refused at start-up (more GPUs per job come with nodes_per_job); null: not checked."""
    states_per_job: Positive | Literal["auto"] = "auto"
    """States one cluster job measures one after another. auto: one, or under walltime estimate as
    many short states as make about an hour of requested work (2 × each state's estimated work, at
    most 32), so that hundreds of minute-long states do not flood the queue; a number fixes it (a
    profile's group-components analysis=N overrides both)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ClusterSettings:
        """The settings of a ``cluster`` section, typed by the one loader (unknown keys are the
        schema's to refuse: the section holds the profile's other keys too)."""
        return build(cls, {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}, "cluster.")

    @property
    def estimated(self) -> bool:
        """Whether walltimes come from the timing estimate (no explicit walltime)."""
        return self.walltime == "estimate" and not self.walltime_hours


def parallel_seconds(seconds: float, ranks: int) -> float:
    """A job's time on ``ranks`` ranks from its time on one: ``seconds / (1 + (ranks − 1) · efficiency)``."""
    return seconds / (1 + (ranks - 1) * PARALLEL_EFFICIENCY)


@dataclass(frozen=True)
class CaseWork:
    """The work of one (state, case) job."""

    noise_samples: int
    """S_v actually drawn (capped by the epoch)."""
    gradient_microbatches: int
    """Forward + backward micro-batches: ḡ over the epoch, then each sampled gᵢ."""
    directions: int
    """Quadratic forms: S_v noise, S_r random, ḡ, one per worker with consensus, and the step Δ to
    the successor (each per block too, with block curvature)."""
    passes: int
    """Passes over the epoch, K directions each."""
    hvp_microbatches: int
    """Curvature micro-batches per pass."""
    audit_gradient_microbatches: int = 0
    """float64 gradient micro-batches of the precision audit: ḡ over the epoch and the audited gᵢ."""
    audit_microbatches: int = 0
    """Curvature micro-batches the audit measures, once in the production precision, once in float64."""
    forward_microbatches: int = 0
    """Forward-only micro-batches: the epoch's loss at θ + Δ of the trajectory statistics."""

    def seconds(self, timing: dict[str, float]) -> float:
        """Estimated seconds of the job from a timing entry: the process's start (interpreter and
        imports), the model's set-up, the gradient micro-batches, the passes, and the audit (each
        where the entry has it; entries measured before they were added lack them)."""
        audit = self.audit_gradient_microbatches * timing.get(
            "audit_gradient_microbatch", 0.0
        ) + self.audit_microbatches * (timing["hvp_microbatch_pass"] + timing.get("audit_microbatch_pass", 0.0))
        forward = timing.get("forward_microbatch", timing["gradient_microbatch"])  # unmeasured: a gradient's, at most
        return (
            timing.get("process", 0.0)
            + timing["startup"]
            + self.gradient_microbatches * timing["gradient_microbatch"]
            + self.forward_microbatches * forward
            + self.passes * self.hvp_microbatches * timing["hvp_microbatch_pass"]
            + audit
        )


def case_work(
    config: RunConfig, settings: AnalysisSettings, workers: int = 0, epoch: tuple[int, int] | None = None
) -> CaseWork:
    """Counts of one (state, case) job of this run and these settings (``workers`` > 1 adds the
    consensus directions of a packed run; ``epoch``: the case's (batches, sequences a batch) where
    they are not the run's epoch, as a training order's window). With ``settings.trajectory`` the
    job is priced as one with a successor (every state but the last): the step Δ (per block too)
    and the loss at θ + Δ; unless ``preconditioned`` is false, the forms in the optimizer's
    geometry too."""
    B, mb = (epoch or (0, config.training.batch_size))[1], config.training.micro_batch_size
    plan = measurement_plan(config, settings, workers, epoch)
    micro = math.ceil(B / mb)  # training's micro-batches of a batch gradient
    return CaseWork(
        noise_samples=plan.noise_samples,
        gradient_microbatches=plan.gradient_batches * micro,
        directions=plan.directions,
        passes=plan.passes(settings.directions_per_pass),
        hvp_microbatches=plan.hvp_batches,
        audit_gradient_microbatches=plan.audit_gradient_batches * micro,
        audit_microbatches=plan.audit_micro_batches,
        forward_microbatches=plan.forward_batches * micro,
    )


def measurement_plan(
    config: RunConfig, settings: AnalysisSettings, workers: int = 0, epoch: tuple[int, int] | None = None
) -> MeasurementPlan:
    """The counts of one (state, case) job of this run and these settings, as the worker counts
    them (it records the same in its result's ``measurement_plan``): with ``settings.trajectory`` a state with a
    successor, unless ``preconditioned`` is false the optimizer's geometry too; ``epoch``: the case's
    (batches, sequences a batch), by default the run's epoch."""
    n, B = epoch or (config.steps_per_epoch, config.training.batch_size)
    mb = config.training.micro_batch_size
    return MeasurementPlan.of(
        n,
        settings.noise_samples,
        settings.random_samples,
        consensus=workers if workers > 1 else 0,
        blocks=block_count(config.model.n_layers, config.model.tie_embeddings) if settings.block_curvature else 0,
        step=settings.trajectory,
        geometries=1 + (settings.preconditioned is not False),  # priced where it may be measured
        hvp_batches=math.ceil(n * B / (settings.hvp_batch_size or mb)),
        audit=settings.audit_directions if settings.audited else 0,
        audit_batches=settings.audit_batches if settings.audited else 0,
    )


def estimate_seconds(
    config: RunConfig,
    settings: AnalysisSettings,
    seconds: dict[str, float],
    workers: int = 0,
    epoch: tuple[int, int] | None = None,
) -> float:
    """Estimated work of one (state, case) job, from the actual full-epoch counts and samples."""
    return case_work(config, settings, workers, epoch).seconds(seconds)


STATE_JOB_MINUTES = 60
"""Requested minutes a cluster job of short states is filled to under ``states_per_job: auto``."""
MAX_STATES_PER_JOB = 32


def states_per_job(cases: int, each: float, setting: int | str = "auto") -> int:
    """States one cluster job measures one after another: ``setting`` when a number; under auto, as
    many as fill :data:`STATE_JOB_MINUTES` with 2 × the estimated work of ``cases`` cases of
    ``each`` seconds (at least one, at most :data:`MAX_STATES_PER_JOB`)."""
    if setting != "auto":
        return int(setting)
    per_state = cases * math.ceil(2 * each / 60)
    return max(1, min(MAX_STATES_PER_JOB, STATE_JOB_MINUTES // max(per_state, 1)))


def check_packing(analysis: str, states: int, minutes: Callable[[int], float]) -> None:
    """A cluster job of ``states`` states (``minutes(n)``: the walltime of one of n) must fit the
    partition.

    Raises:
        ValueError: naming ``cluster.states_per_job`` and the most states that fit.
    """
    limit = MAX_HOURS * 60
    if states > 1 and minutes(states) > limit:
        fits = max((n for n in range(1, states) if minutes(n) <= limit), default=1)
        raise ValueError(
            f"cluster.states_per_job: {states} states of analysis {analysis} in one job ask for "
            f"{minutes(states) / 60:.3g} h, beyond the partition's {MAX_HOURS} h; set it to {fits} or less (or auto)"
        )


def finish_minutes(cases: int, each: float, states: int = 1) -> int:
    """The minutes of a state's last job (``finish_state``): one state's margin, what completes
    2 × work of ``cases`` cases of ``each`` seconds (2 × work each) to :func:`job_minutes`, shared by
    the ``states`` states of a cluster job (at least a minute each)."""
    return max(1, math.ceil((job_minutes(cases * each) - cases * math.ceil(2 * each / 60)) / states))


def group_minutes(states: int, cases: int, each: float) -> int:
    """The walltime of a cluster job of ``states`` states (``cases`` cases of ``each`` seconds), as
    Snakemake sums it over the jobs it runs one after another: 2 × work per case and each state's
    share of the margin; for one state, :func:`job_minutes`."""
    return states * (cases * math.ceil(2 * each / 60) + finish_minutes(cases, each, states))


def job_minutes(work_seconds: float) -> int:
    """Walltime in minutes: 2 × work + 30 min, rounded up to the hour.

    Raises:
        ValueError: above the 72-hour partition limit.
    """
    hours = math.ceil((2 * work_seconds + 1800) / 3600)
    if hours > MAX_HOURS:
        raise ValueError(
            f"estimated walltime {hours} h exceeds the partition limit of {MAX_HOURS} h; "
            "analyse fewer samples per job or split the checkpoints over several analyses"
        )
    return hours * 60


_ROOT = re.compile(r"epoch-\d{3}\.safetensors|final\.pt")


def expected_states(
    config: RunConfig | None, run_dir: str | Path, selection: str | list[str], analysis_dir: str | Path | None = None
) -> tuple[int, str]:
    """At most how many unique states an analysis measures, and where the number comes from.

    The analysis's index (states.json), once written, is exact. Before it, a listed selection
    counts its files; ``all`` counts the checkpoints of a finished run, or those the run
    configuration will write (interval: the initialisation and one per virtual epoch, final.pt an
    alias of the last; final: one). Identical checkpoints can only make the number smaller.
    """
    index = Path(analysis_dir) / STATES if analysis_dir is not None else None
    if index is not None and index.exists():
        return len(json.loads(index.read_text())["states"]), "indexed"
    if isinstance(selection, list):
        return len(selection), "listed checkpoints"
    run_dir = Path(run_dir)
    existing = sorted(p.name for p in run_dir.glob("*") if _ROOT.fullmatch(p.name)) if run_dir.is_dir() else []
    if config is None or (existing and ((run_dir / FINAL).exists() or (run_dir / IMPORTED).exists())):
        epochs = [name for name in existing if name.startswith("epoch-")]
        return max(1, len(epochs) or len(existing)), "checkpoints in the run"
    if config.training.checkpoint_policy == "interval":
        return config.training.epochs + 1, f"interval checkpoints: initialisation + {config.training.epochs} epochs"
    return 1, "final checkpoint only (training.checkpoint_policy: final)"


def format_seconds(seconds: float) -> str:
    """Seconds as a short human duration (s, min or h)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def spectrum_products(spectrum: SpectrumSettings, geometries: int) -> int:
    """At most the Hessian-vector products of one (state, case) spectrum, each a pass over the
    case's curvature micro-batches: the top eigenpairs' Lanczos in each geometry, the SLQ vectors'
    steps, the block-diagonal error's directions (the whole product and the blocks') and the CG solve."""
    return (
        spectrum.lanczos_steps * geometries
        + spectrum.slq_vectors * spectrum.slq_steps
        + 2 * spectrum.block_samples
        + spectrum.cg_max_iterations
    )


def _times(gpus: int) -> str:
    return f" × {gpus} GPUs" if gpus > 1 else ""


@dataclass(frozen=True)
class Jobs:
    """An analysis's jobs: at most ``states`` states (found by ``source``: an interval, a list…),
    each measured on every one of ``cases``, a job over ``ranks`` ranks (GPUs, or CPU processes on
    ``cpu``)."""

    states: int
    source: str
    cases: tuple[str, ...]
    ranks: int = 1


def cost_line(
    name: str,
    jobs: Jobs,
    work: CaseWork,
    device: str,
    timing: dict[str, Any] | None,
    cluster: ClusterSettings | None = None,
) -> str:
    """One line for the console before a run: jobs, the work of each, and the estimated time.

    ``timing`` is a timing entry (``{"seconds": ..., "measured": ...}``) or None. With ``cluster``
    (the workflow's cluster settings) under a walltime rule, the line adds what Slurm will be
    asked for: one job per state holding both cases, its walltime, and the GPU-hours requested.
    With several ranks per job, its time is scaled by :func:`parallel_seconds` and every hour of
    it holds that many GPUs.
    """
    count, source, cases, gpus = jobs.states, jobs.source, jobs.cases, jobs.ranks
    jobs = count * len(cases)
    line = (
        f"analysis {name}: ≤ {count} states ({source}) × {len(cases)} cases = {jobs} (state, case) jobs; each: "
        f"{work.gradient_microbatches} gradient micro-batches, {work.directions} quadratic forms in "
        f"{work.passes} passes × {work.hvp_microbatches} curvature micro-batches"
    )
    if work.forward_microbatches:
        line += f", {work.forward_microbatches} forward micro-batches (the loss at θ + Δ; not at the last state)"
    if gpus > 1:
        line += f", split over {gpus} {'CPU processes' if device == 'cpu' else 'GPUs'}"
    each = None if timing is None else parallel_seconds(work.seconds(timing["seconds"]), gpus)
    if each is None:
        line += f"; time: no timing entry for this setup on {device}"
    else:
        measured, kind = timing.get("measured", {}), (timing.get("key") or {}).get("device_kind", device)
        line += (
            f"; about {format_seconds(each)} per job, {format_seconds(jobs * each)} in all on {device} "
            f"(timings measured on {kind}, {measured.get('at', '?')[:10]})"
        )
    return line + _slurm_part(name, count, len(cases), each, cluster or ClusterSettings(), gpus)


def _slurm_part(name: str, count: int, cases: int, each: float | None, cluster: ClusterSettings, gpus: int) -> str:
    """What a cost line says Slurm is asked for: ``count`` states of ``cases`` cases of ``each``
    seconds (None: not measured yet) under the cluster's walltime rule, packed as it packs them.

    Raises:
        ValueError: packed jobs beyond the partition's walltime (:func:`check_packing`).
    """
    part = ""
    if cluster.walltime_hours:
        hours = float(cluster.walltime_hours)
        per_job = 1 if cluster.states_per_job == "auto" else max(1, min(count, int(cluster.states_per_job)))
        check_packing(name, per_job, lambda n: n * hours * 60)
        jobs = -(-count // per_job)
        packed = f" of ≤ {per_job} states × {hours:g} h" if per_job > 1 else f" × {hours:g} h"
        part = (
            f"; Slurm: ≤ {jobs} jobs{packed} (cluster.walltime_hours){_times(gpus)} = "
            f"{count * hours * gpus:g} GPU-hours requested"
        )
    elif cluster.walltime == "estimate":
        if each is None:
            part = (
                f"; Slurm walltime: from the calibration job, which runs first on the target node "
                f"(results/timing/{name}.json; or set cluster.walltime_hours)"
            )
        else:
            per_job = max(1, min(count, states_per_job(cases, each, cluster.states_per_job)))
            check_packing(name, per_job, lambda n: group_minutes(n, cases, each))
            jobs, hours = -(-count // per_job), group_minutes(per_job, cases, each) / 60
            packed = f" of ≤ {per_job} states" if per_job > 1 else ""
            part = (
                f"; Slurm: ≤ {jobs} jobs{packed} × {hours:.3g} h walltime (2 × work + 30 min){_times(gpus)} = "
                f"{jobs * hours * gpus:.4g} GPU-hours requested"
            )
    elif each is None:
        part = " (`snakemake calibrate` measures one)"
    return part
