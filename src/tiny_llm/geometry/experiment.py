"""A cross-seed experiment's measurements: fixed reference batches, one record per checkpoint, and
the comparison of seeds at matched steps.

1. :func:`make_reference` cuts the reference set from a run's token cache once per experiment:
   ``reference_rows`` sequences for the gradient, loss and function-space probes, and
   ``cov_num_batches`` × ``cov_batch_size`` further sequences for the covariance probe. With
   ``held_out`` they come from the unseen stream (cache blocks after training's last shuffle group,
   which no run of the experiment trains on, whatever its data order); otherwise from the first
   epoch of training. Each sequence is recorded by its cache position ``[shard, offset]``.
2. :func:`measure_checkpoint` measures one checkpoint of one run on that reference set and writes
   ``<output>.json`` (the metrics) and ``<output>.safetensors`` (the vectors that comparisons across
   seeds need: the reference gradient, the reference logits and the top-k parameter-space and
   function-space bases), both atomically, the JSON last.
3. :func:`compare` reads every record of an experiment and returns the rows of ``comparison.csv``:
   one per (step, run, metric) and one per (step, pair of runs, metric), each pair metric with its
   baseline for unrelated models (k/d for subspace overlaps, 0 for cosines), and per (step, pair
   metric) the mean and the minimum over the seed pairs.

Definitions of every metric: the module docstring of :mod:`tiny_llm.geometry.metrics` and the README.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tiny_llm.architectures import build_model
from tiny_llm.config import RunConfig, load_config
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.job import Cuts, open_job
from tiny_llm.curvature.spectrum import Basis, top_eigenpairs
from tiny_llm.data.tokens import TokenCache, check_capacity, epoch_plan, unseen_plan
from tiny_llm.geometry import metrics as geometry
from tiny_llm.geometry.settings import GeometrySettings
from tiny_llm.io import atomic_path, atomic_write_json
from tiny_llm.layout import RESOLVED, TRAIN_LOG
from tiny_llm.provenance import canonical_hash, source_hash
from tiny_llm.runtime import resolve_device
from tiny_llm.workers.loading import load_state
from tiny_llm.workers.selection import resolve_checkpoints

log = logging.getLogger(__name__)

__all__ = ["make_reference", "measure_checkpoint"]


# --- the reference set ---------------------------------------------------------------------------


def make_reference(run_config: RunConfig, settings: GeometrySettings) -> dict[str, Any]:
    """The experiment's reference set: block ids and cache positions of the reference rows and of
    the covariance batches, from the unseen stream (held out) or training's first epoch.

    Raises:
        ValueError: the cache holds too few blocks for the reference set.
    """
    cache = TokenCache(run_config.data.cache)
    cache.check_layout(run_config)
    check_capacity(cache, run_config, "unseen" if settings.held_out else "train")
    plan = unseen_plan(run_config) if settings.held_out else epoch_plan(run_config, 1)
    blocks = [int(b) for b in plan.blocks.reshape(-1)]
    need = settings.reference_rows + settings.cov_num_batches * settings.cov_batch_size
    if len(blocks) < need:
        raise ValueError(
            f"the reference set needs {need} sequences (reference_rows + cov_num_batches x "
            f"cov_batch_size) but the {'unseen stream' if settings.held_out else 'first epoch'} "
            f"holds {len(blocks)}; lower them, or train on more tokens"
        )
    rows = blocks[: settings.reference_rows]
    cov = blocks[settings.reference_rows : need]
    size = settings.cov_batch_size
    return {
        "cache": str(run_config.data.cache),
        "held_out": settings.held_out,
        "rows": rows,
        "positions": [list(cache.position(b)) for b in rows],
        "cov_batches": [cov[i : i + size] for i in range(0, len(cov), size)],
        "cov_positions": [[list(cache.position(b)) for b in cov[i : i + size]] for i in range(0, len(cov), size)],
    }


# --- one checkpoint --------------------------------------------------------------------------------


def _training_loss(run_dir: Path, step: int, steps_per_epoch: int) -> float | None:
    """The mean logged training loss over the epoch that ended at ``step`` (None at step 0)."""
    log = run_dir / TRAIN_LOG
    if step <= 0 or not log.exists():
        return None
    losses = [
        record["loss"]
        for record in map(json.loads, log.read_text().splitlines())
        if step - steps_per_epoch < record.get("step", -1) <= step and "loss" in record
    ]
    return sum(losses) / len(losses) if losses else None


def _due(index: int, every: int) -> bool:
    return every > 0 and index % every == 0


def _hessian_proxies(model, rows, settings: GeometrySettings, precision: Precision, metrics, errors) -> None:
    """Hutchinson estimates of tr(H) and of the logits' Jacobian's squared Frobenius norm."""
    trace, trace_se = geometry.hessian_trace(
        model,
        rows,
        settings.hutchinson_samples,
        seed=settings.seed,
        batch_size=settings.hvp_batch_size,
        precision=precision,
    )
    jac, jac_se = geometry.jacobian_frobenius(model, rows, settings.hutchinson_samples, seed=settings.seed)
    metrics.update(hessian_trace=trace, jacobian_frobenius=jac)
    errors.update(hessian_trace=trace_se, jacobian_frobenius=jac_se)


def _hessian_top(
    model, rows, g_ref: torch.Tensor, settings: GeometrySettings, precision: Precision, metrics, where: str
) -> dict[str, Any]:
    """The top Hessian eigenvalue by Lanczos and the reference gradient's alignment with its
    eigenvector (into ``metrics``); returns the Lanczos record (a warning when unconverged)."""
    rows_per_pass = settings.hvp_batch_size
    H = open_job(model, [rows], Cuts(rows_per_pass, rows_per_pass), precision).operator("double_backward")
    tolerance = settings.lanczos_tolerance or (1e-6 if settings.dtype == "float64" else 1e-3)
    values, vectors, residuals, converged = top_eigenpairs(
        H.hvp,
        H.flat.D,
        1,
        min(settings.lanczos_steps, H.flat.D),
        seed=settings.seed,
        basis=Basis(device=precision.device),
        tolerance=tolerance,
    )
    top = vectors[0].double()
    metrics.update(
        hessian_top1_eigenvalue=float(values[0]),
        gradient_to_hessian_top1_alignment=abs(float(g_ref.cpu() @ top.cpu())) / max(float(g_ref.norm()), 1e-300),
    )
    lanczos = {"matvecs": H.passes, "tolerance": tolerance, "residual": float(residuals[0])}
    lanczos["converged"] = bool(converged[0])
    if not lanczos["converged"]:
        log.warning(
            "%s: the top Hessian eigenvalue did not converge in %d Lanczos steps (residual %.2g > "
            "%.2g·|λ|); raise settings.lanczos_steps",
            where,
            settings.lanczos_steps,
            lanczos["residual"],
            tolerance,
        )
    return lanczos


def _write(output: Path, record: dict[str, Any], vectors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The vectors beside the record (.safetensors, its sha256 in the record), then the record."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tensors = output.with_suffix(".safetensors")
    with atomic_path(tensors) as staging:  # the usual permissions under the umask, fsynced, renamed
        save_file(vectors, str(staging))
    record["vectors"] = {"file": tensors.name, "sha256": hashlib.sha256(tensors.read_bytes()).hexdigest()}
    atomic_write_json(output, record)
    return record


def _identity(run_dir: Path, checkpoint: str, index: int, state, config: RunConfig, settings, reference) -> dict:
    """What a checkpoint record is of: the run and checkpoint, its step and tokens, its state, the
    seeds, the settings, the source and the reference set."""
    return {
        "schema": "tiny-llm-geometry/1",
        "run": str(run_dir),
        "checkpoint": checkpoint,
        "index": index,
        "step": state.aliases[0]["step"],
        "tokens": state.aliases[0]["tokens"],
        "state_key": state.weights_hash,
        "init_seed": config.training.seed,
        "data_seed": config.data.seed,
        "settings": asdict(settings),
        "source": source_hash(),
        "reference": canonical_hash({"rows": reference["rows"], "cov_batches": reference["cov_batches"]}),
    }


def _llc(model, rows: torch.Tensor, settings: GeometrySettings) -> tuple[float, float]:
    """The local learning coefficient by SGLD (devinterp) with the experiment's settings."""
    return geometry.local_learning_coefficient(
        model,
        rows,
        geometry.SGLD(
            settings.llc_chains, settings.llc_draws, settings.llc_lr, settings.llc_n_beta, settings.llc_localization
        ),
        batch_size=settings.hvp_batch_size,
        seed=settings.seed,
    )


def measure_checkpoint(
    run_dir: str | Path,
    checkpoint: str,
    index: int,
    reference: dict[str, Any],
    settings: GeometrySettings,
    output: str | Path,
) -> dict[str, Any]:
    """Measure ``checkpoint`` (the ``index``-th of its run, 0 for initialisation) on the reference
    set; write ``output`` (.json) and its vectors beside it (.safetensors); returns the record."""
    run_dir, output = Path(run_dir), Path(output)
    config = load_config(run_dir / RESOLVED)
    state = load_state(run_dir, resolve_checkpoints(run_dir, [checkpoint]), config, consensus=False)
    precision = Precision(resolve_device(settings.device), getattr(torch, settings.dtype))
    cache = TokenCache(reference["cache"])
    rows = cache.tokens(reference["rows"]).to(precision.device)
    cov_batches = [cache.tokens(batch).to(precision.device) for batch in reference["cov_batches"]]
    model = build_model(config.model, attention_backend="reference")
    model.load_state_dict(state.root, strict=True)
    model.to(device=precision.device, dtype=precision.dtype)
    mb = config.training.micro_batch_size
    k = settings.top_k

    g_ref, eval_loss = geometry.reference_gradient(model, rows, micro_batch_size=mb, precision=precision)
    G = geometry.batch_gradients(model, cov_batches, micro_batch_size=mb, precision=precision)
    F = geometry.function_gradients(model, G, rows)
    with torch.no_grad():
        logits = model(rows[:, :-1]).double().reshape(-1)
    metrics: dict[str, Any] = {
        "train_loss": _training_loss(run_dir, state.aliases[0]["step"], config.steps_per_epoch),
        "eval_loss": eval_loss,
        "reference_grad_norm": float(g_ref.norm()),
        "function_update_cross_batch_cosine": geometry.cross_batch_cosine(F),
        "fisher_trace": geometry.fisher_trace(model, rows),
    }
    covariance = geometry.concentration(G, k)
    metrics.update(cov_top_k_share=covariance["top_k_share"], cov_effective_rank=covariance["effective_rank"])
    standard_errors: dict[str, float] = {}
    if _due(index, settings.hessian_proxy_every):
        _hessian_proxies(model, rows, settings, precision, metrics, standard_errors)
    lanczos = None
    if _due(index, settings.hessian_eig_every):
        lanczos = _hessian_top(model, rows, g_ref, settings, precision, metrics, f"{run_dir} {checkpoint}")
    if _due(index, settings.llc_every):
        metrics["llc"], standard_errors["llc"] = _llc(model, rows, settings)
    vectors = {
        "reference_gradient": g_ref.cpu().contiguous(),
        "reference_logits": logits.cpu().contiguous(),
        "parameter_basis": geometry.top_subspace(G, k).cpu().contiguous(),
        "function_basis": geometry.top_subspace(F, k).cpu().contiguous(),
    }
    record = {
        **_identity(run_dir, checkpoint, index, state, config, settings, reference),
        "dimensions": {"parameters_D": FlatParameters(model).D, "function_F": int(logits.numel()), "k": k},
        "metrics": metrics,
        "standard_errors": standard_errors,
        "lanczos": lanczos,
        "covariance_eigenvalues": covariance["eigenvalues"],
    }
    return _write(output, record, vectors)
