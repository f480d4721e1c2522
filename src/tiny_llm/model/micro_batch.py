"""One micro-batch: its share of a token-mean loss, forward only or with its gradient added into the
parameters' ``.grad``, and the one rule that cuts an optimizer batch into micro-batches.

Every gradient and loss of the project is a sum of these: training's accumulation of an optimizer
batch (:func:`accumulate_batch_gradient`, which the training loop imports from here), the analysis's
batch and mean gradients and its epoch loss (:mod:`tiny_llm.curvature.gradients`), and the curvature
operator's gradient at a shifted θ (``EpochHessian.gradient_at``). With ``head_tokens`` the output
head and loss of a model of this project's (one with ``hidden``) run that many target positions at a
time (:func:`tiny_llm.model.causal.head_loss_chunks`), so a micro-batch's whole (B, T, V) logits
never exist at once: the same sums.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tiny_llm.model.causal import head_loss_chunks, token_losses

__all__ = ["Precision", "accumulate_batch_gradient", "cut", "gradient", "loss"]

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Precision:
    """Numerical mode of an analysis: parameter dtype, device, bf16 forward autocast."""

    device: torch.device
    dtype: torch.dtype
    amp: bool = False

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when ``amp``, else nothing."""
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def forward(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """Logits with the forward (only) under bf16 autocast when ``amp``."""
        with self.autocast():
            return model(inputs)


def cut(tokens: torch.Tensor, rows: int) -> MicroBatches:
    """(inputs, targets) of consecutive ``rows`` sequences of (B, T+1) tokens, the last the rest:
    how training cuts an optimizer batch, and so how the analysis replays it."""
    return [(tokens[s : s + rows, :-1], tokens[s : s + rows, 1:]) for s in range(0, len(tokens), rows)]


def _autocast(precision: Precision | None) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if precision is None else precision.autocast()


def _chunked(model: nn.Module, targets: torch.Tensor, head_tokens: int | None) -> bool:
    return head_tokens is not None and head_tokens < targets.numel() and hasattr(model, "hidden")


def gradient(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, n_targets: int,
             precision: Precision | None = None, head_tokens: int | None = None) -> torch.Tensor:  # fmt: skip
    """Add ∇(Σ ℓ / ``n_targets``) of one micro-batch into the parameters' ``.grad`` (the forward
    under ``precision``'s autocast; None: the model as it is) and return that loss, detached, in
    float64."""
    if _chunked(model, targets, head_tokens):
        with _autocast(precision):
            h = model.hidden(inputs)
            total, grad_h = head_loss_chunks(model, h, targets, 1 / n_targets, head_tokens, parameter_grads=True)
        h.backward(grad_h)
        return total
    with _autocast(precision):
        logits = model(inputs)
    value = token_losses(logits, targets).sum() / n_targets
    value.backward()
    return value.detach().double()


def loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, n_targets: int,
         precision: Precision | None = None, head_tokens: int | None = None) -> torch.Tensor:  # fmt: skip
    """Σ ℓ / ``n_targets`` of one micro-batch from a forward pass only, in float64: the same number
    as :func:`gradient` returns (the same head chunks)."""
    with torch.no_grad():
        if not _chunked(model, targets, head_tokens):
            with _autocast(precision):
                logits = model(inputs)
            return (token_losses(logits, targets).sum() / n_targets).double()
        total = torch.zeros((), dtype=torch.float64, device=inputs.device)
        with _autocast(precision):
            h = model.hidden(inputs)
            h, y = h.reshape(-1, h.size(-1)), targets.reshape(-1)
            for s in range(0, y.numel(), head_tokens):
                part = token_losses(model.logits(h[s : s + head_tokens]), y[s : s + head_tokens])
                total += (part.sum() * (1 / n_targets)).double()
        return total


def accumulate_batch_gradient(
    model: nn.Module,
    tokens: torch.Tensor,
    micro_batch_size: int,
    precision: Precision | None = None,
    head_tokens: int | None = None,
    share: Callable[[MicroBatches], MicroBatches] | None = None,
) -> torch.Tensor:
    """Add the gradient of one optimizer batch's token-mean loss into ``.grad``, micro-batch by micro-batch.

    ``tokens`` is (B, T + 1), cut by :func:`cut`; each micro-batch contributes ``sum(token losses) /
    (B*T)``. Training runs this (``precision`` None: the model as it is); the analysis replays it for
    its batch gradients under its precision. ``share`` (a model sharded over the ranks) picks this
    rank's micro-batches, the ranks computing the batch together. Returns the batch loss (this
    rank's micro-batches') in float64.
    """
    micro, n_targets = cut(tokens, micro_batch_size), tokens[:, 1:].numel()
    total = torch.zeros((), dtype=torch.float64, device=tokens.device)
    for x, y in share(micro) if share else micro:
        total += gradient(model, x, y, n_targets, precision, head_tokens)
    return total
