"""The settings of an analysis, torch-free: what every wing (the command line, the workflow, the
workers) reads and validates, with the real defaults in one place.

``AnalysisSettings`` (numerical and sampling settings of a (state, case) analysis, all part of a
result's identity but ``EXECUTION_SETTINGS``), ``SpectrumSettings`` (a spectrum's), their readers
from configuration data, and which engine they resolve to (``quadratic_form_engine``,
``sharded_engine``) from the registry of :mod:`tiny_llm.curvature.engines`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from tiny_llm.architectures import jet_rules
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.engines import (
    AMP_DIFFERENCES,
    AUTO,
    JET_REFUSAL,
    default_forms_engine,
    names,
    sharded_names,
)
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.declared import NonNegative, Pattern, Positive, PositiveNumber, build, check_fields

ENGINE_SETTINGS = (AUTO, *names())
"""What ``engine`` may be set to: auto or a registered engine."""
EngineSetting = Literal[ENGINE_SETTINGS]  # the registry's names, as a type


CASES = ("seen", "unseen", "offset", "recent", "step")
"""seen: epoch 1 as trained; unseen: one epoch after training's final shuffle group; offset: one
batch-aligned epoch of the cache from ``data_offset`` batches on (the case of imported runs,
whose training stream is not known). A suite trained elsewhere whose published training order is
given reads seen, unseen and recent as windows of its training steps
(:mod:`tiny_llm.data.training_order`)."""


EXECUTION_SETTINGS = ("memory_budget_gb",)
"""Settings that change how the work is cut, not its numbers: not part of identities or bindings."""


@dataclass(frozen=True, kw_only=True)
class AnalysisSettings:
    """Numerical and sampling settings of an analysis (all part of a result's identity)."""

    noise_samples: Positive | None = 32
    """S_v, sampled effective batches (all, None in code: every batch of the epoch; capped by the epoch)."""
    random_samples: NonNegative = 32
    """S_r, Rademacher directions."""
    seed: NonNegative = 42
    """Seed of the noise-batch draw and the Rademacher directions (reused across checkpoints)."""
    hvp_batch_size: Positive | None = None
    """Curvature micro-batch size (None = training.micro_batch_size); never changes H."""
    directions_per_pass: Positive = 16
    """K directions share each pass over the data; bounded by memory."""
    engine: EngineSetting = AUTO
    """Engine of every quadratic form vᵀHv: taylor or adjoint (second derivatives along v, no Hv),
    or an HVP engine. auto: adjoint for K > 1 directions per pass, taylor for K = 1 (the fastest
    exact engines measured). Spectra need Hv: they use this engine when it is an HVP engine, else
    pearlmutter (compiled) on CUDA and double_backward on CPU."""
    compile_hvp: bool = True
    """torch.compile the Pearlmutter product on CUDA (CPU analysis stays eager)."""
    device: Annotated[str, Pattern(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N")] = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available; the demo sets cpu)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter dtype of the analysis model; float64 for derivative checks."""
    tf32: bool = True
    """TF32 matmuls for float32 on CUDA."""
    amp: bool = False
    """bf16 autocast in the forward only (float32 parameters; scores, norms, cross-entropy fp32)."""
    consensus: bool = True
    """Packed runs: measure each worker's consensus error eᵢ = xᵢ − x̄."""
    block_curvature: bool = False
    """Also measure each parameter block's block-diagonal forms vᵢ,bᵀH_bb vᵢ,b and ḡ_bᵀH_bb ḡ_b (one
    more quadratic form per noise sample and block, and per block for ḡ), giving B_noise per block
    in blocks.csv (with 6 blocks and 8 noise samples the demo's 41 forms become 95, a job 2.1× as
    long)."""
    trajectory: bool = True
    """At every state with a successor (the next analysed checkpoint θ'), the statistics along the
    step training took, Δ = θ' − θ: ḡᵀΔ, ΔᵀHΔ (and its Gauss–Newton part), ΔᵀHΔ/‖Δ‖², the quadratic
    model's best step −ḡᵀΔ/ΔᵀHΔ and its predicted loss change beside the change measured at θ' on
    the same epoch (summary.csv; per block in blocks.csv with block_curvature): one more quadratic
    form and one more gradient pass per (state, case), and per block with block_curvature."""
    preconditioned: bool | Literal["auto"] = "auto"
    """Also take every statistic in the optimizer's own geometry, u = P^{-1/2}θ with Adam's
    P = diag(1/(√v̂ + ε)) at the checkpoint (bias correction included, as the step applied it; P = I
    for SGD): B_simple,P, B_noise,P, the curvature along Pḡ and the best step along −Pḡ (the
    ``precond_*`` columns), and in spectra the top eigenvalues of P^{1/2}HP^{1/2} beside the
    edge-of-stability value (2 + 2β1)/((1 − β1)η). It measures the noise, ḡ and random forms once more. auto: where the
    checkpoint's optimizer state is kept (training here with ``keep_moments``; Trainer checkpoints
    imported with their optimizer.pt), blank with the reason elsewhere (the initialisation, packed
    runs, suites that publish weights only); true: refuse a checkpoint without it (the workflow names
every selected one at start-up, before any job); false: plain only."""
    sharded: bool = False
    """With several ranks (``gpus_per_job`` × ``nodes_per_job``), shard the model and every
    parameter-sized vector over them with FSDP2, for a model whose statistics do not fit one device:
    the forms are then exact by the Taylor mode block by block (engine auto or taylor), or finite
    differences of gradients (engine finite_difference, and auto for a model without second-order
    rules; other engines are refused); spectra are sharded too, and so is the precision audit (its
    float64 copy of the model as well). The statistics are the same as one process's; the memory
    plan is per rank."""
    audit: bool | Literal["auto", "on", "off"] = "auto"
    """Precision audit, first in the job: ḡ and the loss over the epoch in float64, and a seeded
    subset of the directions rebuilt and measured in float64, giving the error each statistic
    implies (true or on / false or off). auto: on unless the analysis runs in float64 without
    autocast."""
    audit_directions: Positive = 4
    """Audited noise directions and random directions (each; ḡᵀHḡ is always audited)."""
    audit_batches: Positive = 4
    """Curvature micro-batches (seeded) over which the audit compares production and float64."""
    data_offset: NonNegative = 0
    """Case offset: the epoch starts this many batches (of training.batch_size sequences) into the
    cache, in cache order."""
    memory_budget_gb: PositiveNumber | None = None
    """Memory (GiB) a job may use on its device; every pass is cut into groups of sequences that the
    memory model says fit it (the numbers do not change, so it is not part of a result's identity).
    None: on CUDA the device's free memory less a tenth (at least 2 GiB), elsewhere no budget."""

    @property
    def audited(self) -> bool:
        """Whether the precision audit runs."""
        return self.audit is True or (self.audit == "auto" and (self.dtype != "float64" or self.amp))

    def __post_init__(self) -> None:
        if self.audit in ("on", "off"):  # the command line's words, in a configuration too
            object.__setattr__(self, "audit", self.audit == "on")
        if self.engine not in ENGINE_SETTINGS:  # a name beside the registry's, before the types' message
            raise ValueError(f"engine: expected one of {', '.join(ENGINE_SETTINGS)}, got {self.engine!r}")
        check_fields(self)  # types, literals and ranges, as the loader checks them; cross-field below
        if self.amp and self.dtype != "float32":
            raise ValueError("--amp requires --dtype float32 (bf16 autocast with float32 parameters)")


def numerical_settings(settings: AnalysisSettings) -> dict[str, Any]:
    """The settings that decide a result's numbers (all but EXECUTION_SETTINGS)."""
    return {k: v for k, v in asdict(settings).items() if k not in EXECUTION_SETTINGS}


def settings_record(settings: AnalysisSettings) -> dict[str, Any]:
    """The settings as a result records them: plain data, with every batch as ``noise_samples: all``
    (as written in a configuration)."""
    record = asdict(settings)
    if record["noise_samples"] is None:
        record["noise_samples"] = "all"
    return record


def settings_from_dict(data: dict[str, Any]) -> AnalysisSettings:
    """AnalysisSettings from plain config data (``noise_samples: all`` means every batch).

    Raises:
        ValueError: unknown keys or impossible values, naming them.
    """
    values = dict(data)
    if values.get("noise_samples") == "all":
        values["noise_samples"] = None
    if values.get("audit") in ("on", "off"):  # the command line's words, in a configuration too
        values["audit"] = values["audit"] == "on"
    return build(AnalysisSettings, values)


def quadratic_form_engine(settings: AnalysisSettings, model: ModelConfig | None = None) -> str:
    """The engine of the quadratic forms: ``settings.engine``, with auto as the registry's default
    (:func:`tiny_llm.curvature.engines.default_forms_engine`: adjoint for K > 1 directions per pass,
    taylor for K = 1); for a Hugging Face model of another architecture (``model.architecture:
    hf``, no second-order rules) auto is double_backward, and the jet engines are refused.

    Raises:
        ValueError: a jet engine for an ``hf`` model, or forms by finite differences under bf16
            autocast (``amp``), before any work.
    """
    jets = model is None or jet_rules(model)
    if settings.sharded:
        if settings.engine == AUTO:
            chosen = default_forms_engine(settings.directions_per_pass, jets, sharded=True)
            if not engine_named(chosen).second_derivatives:
                _refuse_amp(settings, f"sharded: a model without second-order rules has its forms by {chosen}")
            return chosen
        if not engine_named(settings.engine).sharded:
            raise ValueError(
                f"sharded: the engines that run on a sharded model are {', '.join(sharded_names())} "
                f"(or auto), not {settings.engine}"
            )
    if settings.engine == AUTO:
        return default_forms_engine(settings.directions_per_pass, jets)
    if not jets and engine_named(settings.engine).jets:
        raise ValueError(f"engine {settings.engine}: {JET_REFUSAL}")
    if not engine_named(settings.engine).second_derivatives:
        _refuse_amp(settings, f"engine {settings.engine}")
    return settings.engine


def _refuse_amp(settings: AnalysisSettings, what: str) -> None:
    """Refuse ``what``, which computes by finite differences of gradients, under bf16 autocast
    (``AMP_DIFFERENCES``), naming the setting to change."""
    if settings.amp:
        raise ValueError(f"{what}: {AMP_DIFFERENCES}; analyse it without amp (amp: false, or without --amp)")


@dataclass(frozen=True, kw_only=True)
class SpectrumSettings:
    """Spectral settings (part of a spectrum result's identity)."""

    top_k: Positive = 3
    """Eigenpairs reported (largest algebraic, and largest magnitude)."""
    lanczos_steps: Positive = 100
    """Most Lanczos iterations for the top eigenpairs (full reorthogonalisation); it stops earlier
    once every wanted eigenpair has converged (``lanczos_tolerance``)."""
    lanczos_tolerance: PositiveNumber | None = None
    """Converged: residual ‖Hu − λu‖ ≤ this · |λ|. None: 1e-6 for a float64 analysis, 1e-3 for
    float32 (its Hessian-vector products are not more accurate than that)."""
    lanczos_basis: Literal["float64", "float32", "bfloat16"] = "float64"
    """Storage dtype of the Lanczos vectors."""
    lanczos_reduction: Literal["float64", "float32"] = "float64"
    """Dtype of the Lanczos dot products, norms and reorthogonalisation (float32 with a bfloat16
    basis: low-precision storage with float32 reductions)."""
    slq_vectors: Positive = 2
    """SLQ starting vectors n_v."""
    slq_steps: Positive = 10
    """SLQ Lanczos steps m per vector."""
    block_samples: Positive = 2
    """Rademacher directions for the block-diagonal error."""
    cg_damping: float | None = None
    """λ of the solve (H + λI)x = ḡ; null = twice the largest eigenvalue magnitude found."""
    cg_rtol: PositiveNumber = 1e-6
    """Relative residual at which CG stops."""
    cg_max_iterations: Positive = 50
    """CG iteration cap (the residual reached is reported)."""
    preconditioner: Literal["applied", "next"] = "applied"
    """Which of Adam's preconditioners the preconditioned sharpness λ_max(PH) uses: applied, the P
    the optimizer applied at its last step (as the checkpoint keeps it); next, the P of the step
    Adam takes from the checkpoint, its second moment one step further on the case's full-batch
    gradient (as Cohen et al. 2022 pair H(θ_t) with P_t+1 in full-batch Adam)."""
    sharded: bool = False
    """Shard the model, directions and Lanczos vectors over the job's ranks with FSDP2 (a model that
    does not fit one device); the products are then shard-local finite differences of gradients
    (engine auto or finite_difference). With one rank it runs the same products unsharded."""

    def __post_init__(self) -> None:
        check_fields(self, "spectrum.")  # types, literals and ranges, as the loader checks them
        if self.lanczos_steps < self.top_k:
            raise ValueError(f"spectrum.lanczos_steps: expected at least top_k={self.top_k}, got {self.lanczos_steps}")


def spectrum_settings_from_dict(data: dict[str, Any]) -> SpectrumSettings:
    """SpectrumSettings from config data, refusing unknown keys."""
    return build(SpectrumSettings, {k: v for k, v in data.items() if k != "enabled"}, "spectrum.")


def sharded_engine(settings: AnalysisSettings, spectrum: SpectrumSettings) -> str | None:
    """The products engine of a sharded spectrum (``spectrum.sharded`` or the analysis's ``sharded``):
    the analysis's engine when it computes products (and runs sharded), else the first registered
    products engine that runs sharded (finite differences); None unsharded.

    Raises:
        ValueError: another Hessian-vector-product engine asked for by name, or bf16 autocast
            (``amp``: finite differences would measure its rounding).
    """
    if not (spectrum.sharded or settings.sharded):
        return None
    if settings.engine != AUTO and engine_named(settings.engine).products and not engine_named(settings.engine).sharded:
        raise ValueError(
            f"spectrum.sharded: the products engines that run on a sharded model are "
            f"{', '.join(sharded_names('products'))}; set engine to one of them or auto, not {settings.engine}"
        )
    named = settings.engine != AUTO and engine_named(settings.engine).products
    chosen = settings.engine if named else sharded_names("products")[0]  # the first that runs sharded
    if not engine_named(chosen).second_derivatives:
        where = "spectrum.sharded" if spectrum.sharded else "settings.sharded"
        _refuse_amp(settings, f"{where}: a sharded spectrum has its products by differences")
    return chosen
