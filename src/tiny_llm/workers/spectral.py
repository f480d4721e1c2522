"""The spectral measurement of one (state, case), as plain data: Lanczos top eigenpairs with
residuals, the SLQ density, the gradient's and the noise's alignment with the top eigenvectors, a
damped CG solve and block-diagonal errors, on the whole operator or sharded over the ranks, with
progress counted in Hessian-vector products. The spectrum worker (:mod:`tiny_llm.workers.spectrum`)
checks, binds and writes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tiny_llm.curvature import spectrum as spectra
from tiny_llm.curvature.gradients import noise_batch_indices
from tiny_llm.curvature.hessian import CurvatureOperator, FlatParameters, Precision
from tiny_llm.curvature.job import Cuts, open_job
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.curvature.placement import place
from tiny_llm.curvature.spectrum import Basis, layer_blocks, tensor_blocks
from tiny_llm.curvature.vectors import Layout, rademacher
from tiny_llm.model.causal import CausalLM
from tiny_llm.model.moments import next_preconditioner
from tiny_llm.runtime import compile_record
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

__all__ = ["BASIS_DTYPES", "ProductProgress", "SpectrumJob", "lanczos_tolerance", "measure_spectrum"]

log = logging.getLogger(__name__)


BASIS_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _pairs(
    values: torch.Tensor, residuals: torch.Tensor, converged: torch.Tensor, tolerance: float
) -> list[dict[str, Any]]:
    return [
        {"index": i, "eigenvalue": float(v), "residual": float(r), "converged": bool(c), "tolerance": tolerance}
        for i, (v, r, c) in enumerate(zip(values, residuals, converged, strict=True))
    ]


def lanczos_tolerance(spectrum: SpectrumSettings, dtype: torch.dtype) -> float:
    """The convergence tolerance in force: the setting, or the analysis dtype's default."""
    if spectrum.lanczos_tolerance is not None:
        return spectrum.lanczos_tolerance
    return 1e-6 if dtype == torch.float64 else 1e-3


def _cosines(vectors: torch.Tensor, u: torch.Tensor, layout: Layout) -> list[float]:
    return (layout.reduce(vectors @ u.T) / (layout.norms(vectors)[:, None] * layout.norms(u)[None, :])).abs().tolist()


class ProductProgress:
    """Progress of a spectrum job, counted in Hessian-vector products (every stage's unit of work):
    a line at each stage and at most every ``every`` seconds, with the products done, the most the
    job can take and the time that leaves at the rate so far (an upper bound: Lanczos stops early
    once converged)."""

    def __init__(self, most: int, every: float = 10.0, clock=time.perf_counter):
        self.most, self.every, self.clock = most, every, clock
        self.done, self.started, self.last, self.stage = 0, clock(), None, ""

    def enter(self, stage: str) -> None:
        self.stage = stage
        log.info("spectrum: %s (%d of at most %d products done)", stage, self.done, self.most)

    def __call__(self, count: int) -> None:
        self.done += count
        now = self.clock()
        if self.last is None or now - self.last >= self.every:
            self.last = now
            rate = (now - self.started) / self.done
            log.info(
                "spectrum: %s: %d of at most %d products, %.2g s each, at most %s left",
                self.stage,
                self.done,
                self.most,
                rate,
                _duration(rate * max(0, self.most - self.done)),
            )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class SpectrumJob:
    """What a spectrum of one (state, case) is measured with."""

    settings: AnalysisSettings
    spectrum: SpectrumSettings
    precision: Precision
    hvp_batch_size: int
    engine: str
    """The Hessian-vector products' engine."""
    compile: bool
    micro_batch_size: int
    """Training's micro-batch: the gradients' (cut by ``memory`` when it says so)."""
    memory: MemoryPlan | None = None
    step: torch.Tensor | None = None
    """Δ = θ' − θ to the next state (float64; this rank's rows when sharded), for its share in the
    top eigenspace; None: the state has no successor."""
    preconditioner: torch.Tensor | None = None
    """The optimizer's P at the state (its diagonal, float64, as ``step`` is held), for the top
    eigenvalues of P^{1/2}HP^{1/2}; None: not measured."""
    following: dict[str, Any] | None = None
    """Adam's step, β2 and ε when the spectrum takes the P of the next step
    (:func:`~tiny_llm.model.moments.next_preconditioner` of ``preconditioner`` and ḡ); None: P as applied."""


def _spectrum_operator(
    model: CausalLM, tokens_by_batch: list[torch.Tensor], job: SpectrumJob
) -> tuple[CurvatureOperator, Layout, Callable, Callable]:
    """The operator of a spectrum job, the layout of its vectors, and its batch and epoch gradients,
    as the job's placement holds them (``spectrum.sharded`` in a process group: the model sharded
    over the ranks in place, vectors this rank's parts; else whole)."""
    placement = place(model, job.spectrum.sharded, engine=job.engine)
    cuts = Cuts(job.micro_batch_size, job.hvp_batch_size, job.settings.directions_per_pass, job.compile, job.memory,
                passes=("gradient", "products"))  # fmt: skip
    opened = open_job(model, tokens_by_batch, cuts, job.precision, placement, progress=log.info)

    def gradient(tokens: torch.Tensor) -> torch.Tensor:
        return opened.batch_gradient_and_loss(tokens)[0]

    def epoch_gradient() -> torch.Tensor:
        return opened.mean_gradient_and_loss()[0]

    return opened.operator(job.engine), placement.layout, gradient, epoch_gradient


def _warn_unconverged(pairs: dict, tolerance: float, steps: int) -> int:
    """Count the top eigenvalues (LA and LM) that did not converge, with a warning naming the fix."""
    values, _, residuals, converged = pairs["LA"]
    mag_values, _, mag_residuals, mag_converged = pairs["LM"]
    unconverged = int((~converged).sum() + (~mag_converged).sum())
    if unconverged:
        log.warning(
            "%d of the top eigenvalues did not converge to %g in %d Lanczos steps (largest relative "
            "residual %.2g); raise spectrum.lanczos_steps",
            unconverged,
            tolerance,
            steps,
            float(torch.cat([residuals / values.abs(), mag_residuals / mag_values.abs()]).max()),
        )
    return unconverged


def _cg_record(product: Callable, g_bar: torch.Tensor, damping: float, spectrum: SpectrumSettings, layout) -> dict:
    """The damped solve (H + λI)x = ḡ: its status, iterations, residual and ḡᵀ(H + λI)⁻¹ḡ."""
    try:
        x, iterations, residual = spectra.conjugate_gradient(
            product, g_bar, damping, rtol=spectrum.cg_rtol, max_iterations=spectrum.cg_max_iterations, layout=layout
        )
        return {
            "damping": damping,
            "status": "ok" if residual <= spectrum.cg_rtol else "max_iterations",
            "iterations": iterations,
            "relative_residual": residual,
            "g_inverse_g": float(layout.dots(g_bar[None], x[None])[0]),
        }
    except ValueError as error:  # H + λI indefinite along a CG direction: report, do not guess
        return {
            "damping": damping,
            "status": "indefinite",
            "message": str(error),
            "iterations": None,
            "relative_residual": None,
            "g_inverse_g": None,
        }


def _block_record(product: Callable, flat: FlatParameters, settings, spectrum, layout, device) -> dict:
    """Block-diagonal errors per tensor and per layer on seeded Rademacher directions."""
    V = torch.stack([rademacher(flat.D, settings.seed + 1, i, layout.indices) for i in range(spectrum.block_samples)])
    blocks = {
        kind: (spectra.block_diagonal_error(product, V.to(device), make(flat), layout=layout), len(make(flat)))
        for kind, make in (("tensor", tensor_blocks), ("layer", layer_blocks))
    }
    return {
        kind: {
            "relative_error": r["relative_error"].tolist(),
            "cosine": r["cosine"].tolist(),
            "mean_relative_error": float(r["relative_error"].mean()),
            "mean_cosine": float(r["cosine"].mean()),
            "blocks": count,
        }
        for kind, (r, count) in blocks.items()
    }


def _lanczos_stage(
    product: Callable,
    products: list[int],
    D: int,
    spectrum: SpectrumSettings,
    settings: AnalysisSettings,
    basis: Basis,
    tolerance: float,
) -> tuple[dict[str, Any], torch.Tensor, float]:
    """The top eigenpairs (largest algebraic and largest magnitude) with their residuals: their
    record, the top eigenvectors, and the largest |eigenvalue| found (``products`` counts the
    Hessian-vector products of the stage)."""
    pairs = spectra.top_eigenpairs(
        product,
        D,
        spectrum.top_k,
        spectrum.lanczos_steps,
        seed=settings.seed,
        which=("LA", "LM"),
        basis=basis,
        tolerance=tolerance,
    )
    values, vectors, residuals, converged = pairs["LA"]
    mag_values, _, mag_residuals, mag_converged = pairs["LM"]
    steps = len(products) - 2  # the last two products measure the residuals of LA and LM
    unconverged = _warn_unconverged(pairs, tolerance, steps)
    record = {
        "top_eigenvalues": _pairs(values, residuals, converged, tolerance),
        "top_magnitude_eigenvalues": _pairs(mag_values, mag_residuals, mag_converged, tolerance),
        "lanczos": {
            "steps": steps,
            "max_steps": spectrum.lanczos_steps,
            "tolerance": tolerance,
            "converged": unconverged == 0,
        },
    }
    return record, vectors, float(mag_values.abs().max())


def _slq_stage(
    product: Callable,
    D: int,
    spectrum: SpectrumSettings,
    settings: AnalysisSettings,
    basis: Basis,
) -> dict[str, Any]:
    """The stochastic Lanczos quadrature nodes and weights, and the first two moments over D."""
    nodes = spectra.slq(
        product,
        D,
        spectrum.slq_vectors,
        spectrum.slq_steps,
        seed=settings.seed,
        basis=basis,
    )
    moments = {f"m{p}": sum(float((w * t**p).sum()) for t, w in nodes) / len(nodes) for p in (1, 2)}
    return {
        "nodes": [t.tolist() for t, _ in nodes],
        "weights": [w.tolist() for _, w in nodes],
        "trace_over_D": moments["m1"],
        "second_moment_over_D": moments["m2"],
    }


def _alignment(
    g_bar: torch.Tensor, noise: list[torch.Tensor], vectors: torch.Tensor, layout: Layout, step: torch.Tensor | None
) -> dict:
    """|cos| of ḡ with each top eigenvector and ḡ's share in their span (Σ cos², the eigenvectors
    being orthonormal), the mean |cos| of the noise directions (None when there is no noise to
    align), and with a successor the same |cos| and share of the step Δ training took."""
    noise_cos = (
        _cosines(torch.stack(noise), vectors, layout)
        if noise and float(layout.norms(torch.stack(noise)).sum()) > 0
        else None
    )
    gradient = _cosines(g_bar.unsqueeze(0), vectors, layout)[0]
    moved = None if step is None else _cosines(step.to(g_bar).unsqueeze(0), vectors, layout)[0]
    return {
        "gradient_top": gradient,
        "gradient_top_share": sum(c * c for c in gradient),
        "noise_top_mean": (
            [sum(c[j] for c in noise_cos) / len(noise_cos) for j in range(len(vectors))] if noise_cos else None
        ),
        "step_top": moved,
        "step_top_share": None if moved is None else sum(c * c for c in moved),
    }


def _preconditioned(product: Callable, scale: torch.Tensor, counts: list[int]) -> Callable:
    """V ↦ P^{1/2} H P^{1/2} V (``scale``: P^{1/2}), the Hessian in the optimizer's coordinates
    u = P^{-1/2}θ, whose top eigenvalues are the preconditioned sharpness λ_max(PH); ``counts``
    gets each call's products."""

    def scaled(V: torch.Tensor) -> torch.Tensor:
        counts.append(len(V))
        return scale * product(scale * V)

    return scaled


def _most_products(spectrum: SpectrumSettings, flat: FlatParameters, preconditioned: bool) -> int:
    """The most Hessian-vector products a spectrum job can take: Lanczos and its two residual
    checks (twice with a preconditioner), SLQ, CG with its one check, and the block-diagonal errors."""
    block_products = spectrum.block_samples * (2 + len(tensor_blocks(flat)) + len(layer_blocks(flat)))
    return (
        (spectrum.lanczos_steps + 2) * (1 + preconditioned)
        + 1
        + spectrum.slq_vectors * spectrum.slq_steps
        + spectrum.cg_max_iterations
        + block_products
    )


def measure_spectrum(model: CausalLM, tokens_by_batch: list[torch.Tensor], job: SpectrumJob) -> dict[str, Any]:
    """Every spectral quantity of one (state, case) as plain data; ``memory`` cuts the passes into
    groups of sequences (the same numbers)."""
    started = time.perf_counter()
    flat, settings, spectrum, precision = FlatParameters(model), job.settings, job.spectrum, job.precision
    operator, layout, gradient, epoch_gradient = _spectrum_operator(model, tokens_by_batch, job)
    basis = Basis(
        BASIS_DTYPES[spectrum.lanczos_basis], BASIS_DTYPES[spectrum.lanczos_reduction], precision.device, layout
    )
    device, tolerance, products = precision.device, lanczos_tolerance(spectrum, precision.dtype), []
    progress = ProductProgress(_most_products(spectrum, flat, job.preconditioner is not None))

    def counted(V: torch.Tensor) -> torch.Tensor:
        products.append(len(V))
        return tracked(V)

    def tracked(V: torch.Tensor) -> torch.Tensor:
        result = operator.hvp(V)
        progress(len(V))
        return result

    progress.enter(f"Lanczos, top {spectrum.top_k} eigenpairs (at most {spectrum.lanczos_steps} steps)")
    top, vectors, largest = _lanczos_stage(counted, products, flat.D, spectrum, settings, basis, tolerance)
    t_lanczos = time.perf_counter() - started
    preconditioned, counts = None, []
    g_bar = epoch_gradient()
    if job.preconditioner is not None:
        progress.enter(f"Lanczos of P^1/2 H P^1/2, top {spectrum.top_k} (at most {spectrum.lanczos_steps} steps)")
        P = job.preconditioner
        if job.following is not None:  # the P of the step Adam takes from here, on ḡ
            P = next_preconditioner(P, g_bar.to(P.device), **job.following)
        scaled = _preconditioned(tracked, P.sqrt().to(device), counts)
        preconditioned = _lanczos_stage(scaled, counts, flat.D, spectrum, settings, basis, tolerance)[0]
    progress.enter(f"SLQ density ({spectrum.slq_vectors} x {spectrum.slq_steps} steps)")
    slq_record = _slq_stage(tracked, flat.D, spectrum, settings, basis)
    noise = [
        gradient(tokens_by_batch[i]) - g_bar
        for i in noise_batch_indices(len(tokens_by_batch), settings.noise_samples, settings.seed)
    ]
    # Default λ: twice the largest |Ritz value| (a few Lanczos steps can underestimate |λ_min|).
    damping = spectrum.cg_damping if spectrum.cg_damping is not None else 2 * largest
    progress.enter(f"CG solve of (H + {damping:.3g} I) x = ḡ")
    cg = _cg_record(tracked, g_bar, damping, spectrum, layout)
    progress.enter("block-diagonal errors")
    block_diagonal = _block_record(tracked, flat, settings, spectrum, layout, device)
    return {
        **top,
        "preconditioned": preconditioned,
        "slq": slq_record,
        "alignment": _alignment(g_bar, noise, vectors, layout, job.step),
        "cg": cg,
        "block_diagonal": block_diagonal,
        "counts": {"parameters_D": flat.D, "hvp_batches": len(operator.batches), "noise_samples": len(noise)},
        "timing": {
            "lanczos_seconds": t_lanczos,
            "total_seconds": time.perf_counter() - started,
            "compile": compile_record(),
        },
    }
