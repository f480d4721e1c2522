"""The gradients of a (state, case): the epoch's mean gradient ḡ and loss, the batch gradients gᵢ of
sampled effective batches (accumulated over training's micro-batches, as training computed them),
spread over the ranks when there are several, and the seeded draws of noise batches and Rademacher
directions (fixed functions of the seed, so reused across checkpoints and cases). All float64.
"""

from __future__ import annotations

from typing import Any

import torch

from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.placement import Placement, place
from tiny_llm.data.tokens import derive_seed, group_permutation
from tiny_llm.model import micro_batch
from tiny_llm.model.llama import Llama

NOISE_SAMPLE_STREAM, ROUNDING_STREAM = 2, 5
"""Streams of the seeded draws (``tiny_llm.data.tokens.derive_seed``)."""

__all__ = [
    "batch_gradient",
    "batch_gradient_and_loss",
    "gradient_rounding",
    "mean_gradient",
    "mean_gradient_and_loss",
    "noise_batch_indices",
]


def noise_batch_indices(n_batches: int, samples: int | None, seed: int) -> list[int]:
    """S_v batch indices drawn uniformly without replacement (all when ``samples`` is None or
    exceeds the epoch); a fixed function of the seed, so reused across checkpoints and cases."""
    order = group_permutation(seed, NOISE_SAMPLE_STREAM, 0, n_batches)
    count = n_batches if samples is None else min(samples, n_batches)
    return [int(i) for i in order[:count]]


def placed(model: torch.nn.Module, holder: Placement | FlatParameters) -> Placement:
    """The placement of a gradient's model: ``holder`` itself, or for a model held whole (a
    ``FlatParameters``) one process or data-parallel ranks over the process group."""
    return holder if isinstance(holder, Placement) else place(model)


def batch_gradient_and_loss(
    model: Llama,
    placement: Placement | FlatParameters,
    tokens: torch.Tensor,
    micro_batch_size: int,
    precision: Precision,
    head_tokens: int | None = None,
) -> tuple[torch.Tensor, float]:
    """gᵢ of one optimizer batch (B, T+1), accumulated over training's micro-batches as training
    computed them (in the parameters' ``.grad``), as float64 and as ``placement`` holds vectors (a
    sharded model's ranks compute the batch together, each its share of the micro-batches, and FSDP
    reduce-scatters every backward into their shards), and the batch's token-mean loss (summed over
    micro-batches in float64). With ``head_tokens`` the head and loss run that many target positions
    at a time where the placement allows it (memory only)."""
    placement = placed(model, placement)
    model.zero_grad(set_to_none=True)
    head_tokens = head_tokens if placement.head_chunks else None
    loss = micro_batch.accumulate_batch_gradient(
        model, tokens.to(precision.device), micro_batch_size, precision, head_tokens, placement.share
    )
    g = placement.flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g.double(), float(placement.reduce_shared(loss))


def batch_gradient(*args: Any, **kwargs: Any) -> torch.Tensor:
    """gᵢ alone: :func:`batch_gradient_and_loss`'s gradient, for the same arguments."""
    return batch_gradient_and_loss(*args, **kwargs)[0]


ROUNDING_STEP = 2e-6
"""Relative size of the displacement at which :func:`gradient_rounding` evaluates the gradient."""


def gradient_rounding(model: torch.nn.Module, tokens: torch.Tensor, precision: Precision, seed: int = 0) -> float:
    """The precision floor of a model's gradient on ``tokens`` (B, T+1), measured: the rounding of
    the gradient between evaluations at nearby points, ½‖g(θ+δ) − 2g(θ) + g(θ−δ)‖ / ‖g(θ)‖ with a
    seeded δ of ‖δ‖ = 2e-6 ‖θ‖. In exact arithmetic this is ½‖∇³L[δ, δ]‖ / ‖g‖, about 1e-10; a model
    that computes some operation in float32 gives about float32's rounding (1e-7 and above), since
    the three evaluations round independently. The parameters are restored bit for bit."""
    flat = FlatParameters(model)
    params = list(model.parameters())
    theta = flat.flatten([p.detach() for p in params]).double()
    generator = torch.Generator().manual_seed(derive_seed(seed, ROUNDING_STREAM, 0))
    delta = torch.randn(flat.D, generator=generator, dtype=torch.float64)
    delta *= ROUNDING_STEP * max(float(theta.norm()), 1.0) / float(delta.norm())
    saved = [p.detach().clone() for p in params]
    gradients = []
    try:
        for sign in (1.0, 0.0, -1.0):
            with torch.no_grad():
                for p, value in zip(params, flat.unflatten(theta + sign * delta).values(), strict=True):
                    p.copy_(value.to(p.device, p.dtype))
            gradients.append(batch_gradient(model, flat, tokens, len(tokens), precision))
    finally:
        with torch.no_grad():
            for p, value in zip(params, saved, strict=True):
                p.copy_(value)
    plus, centre, minus = gradients
    return float((plus - 2 * centre + minus).norm() / 2 / centre.norm().clamp_min(1e-300))


def mean_gradient_and_loss(
    model: Llama,
    placement: Placement | FlatParameters,
    batches: list[torch.Tensor],
    micro_batch_size: int,
    precision: Precision,
    head_tokens: int | None = None,
) -> tuple[torch.Tensor, float]:
    """ḡ = Σ_b (N_b / N) g_b over every batch of the epoch, accumulated in float64, and the epoch
    loss L = Σ_b (N_b / N) L_b, the token-mean cross-entropy over every target of the epoch; the
    batches spread over data-parallel ranks, computed together by sharded ones."""
    placement = placed(model, placement)
    n_total = sum(int(b[:, 1:].numel()) for b in batches)
    g = torch.zeros(sum(placement.sizes) + 1, dtype=torch.float64, device=precision.device)  # ḡ and the loss
    for tokens in placement.split(batches):
        g_b, loss_b = batch_gradient_and_loss(model, placement, tokens, micro_batch_size, precision, head_tokens)
        g[:-1] += g_b * (tokens[:, 1:].numel() / n_total)
        g[-1] += loss_b * (tokens[:, 1:].numel() / n_total)
    placement.reduce_split(g)  # reduced together
    return g[:-1], float(g[-1])


def epoch_loss(
    model: Llama,
    batches: list[torch.Tensor],
    micro_batch_size: int,
    precision: Precision,
    head_tokens: int | None = None,
    placement: Placement | None = None,
) -> float:
    """The epoch loss L = Σ_b (N_b / N) L_b from forward passes only, each batch's loss summed
    micro-batch by micro-batch as :func:`mean_gradient_and_loss` sums it (the same number): what
    the loss at a shifted θ costs. The batches spread as that function spreads them (``placement``;
    default: the model whole, on one process or data-parallel ranks), summed in float64."""
    placement = placement or place(model)
    head_tokens = head_tokens if placement.head_chunks else None
    n_total = sum(int(b[:, 1:].numel()) for b in batches)
    total = torch.zeros((), dtype=torch.float64, device=precision.device)
    for tokens in placement.split(batches):
        tokens = tokens.to(precision.device)
        n_batch, batch = tokens[:, 1:].numel(), torch.zeros((), dtype=torch.float64, device=precision.device)
        for x, y in placement.share(micro_batch.cut(tokens, micro_batch_size)):
            batch += micro_batch.loss(model, x, y, n_batch, precision, head_tokens)
        total += float(placement.reduce_shared(batch)) * (n_batch / n_total)
    placement.release()
    return float(placement.reduce_split(total))


def mean_gradient(
    model: Llama,
    flat: FlatParameters,
    batches: list[torch.Tensor],
    micro_batch_size: int,
    precision: Precision,
    head_tokens: int | None = None,
) -> torch.Tensor:
    """ḡ = Σ_b (N_b / N) g_b over every batch of the epoch, accumulated in float64."""
    return mean_gradient_and_loss(model, flat, batches, micro_batch_size, precision, head_tokens)[0]
