"""What an engine is given: the narrow context of one curvature operator's micro-batches
(``MicroBatchContext``), beside its K directions and one micro-batch's inputs and targets. An
engine is a function ``f(context, V, inputs, targets)`` of :mod:`tiny_llm.curvature.engines`; the
context gives it the model and precision, the epoch's target count, the head's token chunks,
the loss and gradient of a micro-batch (θ shifted by the placement), the jet pass and the norms of
vectors as the job's placement holds them, and a place to keep buffers and compiled functions. It
holds the placement privately: an engine never asks which placement it runs under, and every
placement runs it unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch.func import functional_call

from tiny_llm.architectures import jet_rules
from tiny_llm.curvature.placement import Placement
from tiny_llm.model.causal import token_losses
from tiny_llm.model.micro_batch import Precision
from tiny_llm.model.micro_batch import gradient as micro_batch_gradient

__all__ = ["FD_SCALE", "FlatParameters", "MicroBatchContext"]

FD_SCALE = {torch.float64: 1e-6, torch.float32: 3e-4}
"""Default relative step of the finite-difference engine per dtype: ε = scale · max(1, ‖θ‖) / ‖v‖
(chosen from the measured truncation / round-off trade-off, benchmarks/README.md)."""


class FlatParameters:
    """Map between a model's parameters and one flat vector of length D (tied weights once)."""

    def __init__(self, model: torch.nn.Module):
        named = list(model.named_parameters())  # named_parameters() already skips tied duplicates
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.D = sum(self.sizes)

    def flatten(self, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def flatten_state(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.flatten([state[n] for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.view(s) for n, t, s in zip(self.names, flat.split(self.sizes, dim=-1), self.shapes, strict=True)}

    def blocks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Split (K, D) into per-parameter (K, n_p) views."""
        return list(flat.split(self.sizes, dim=-1))


class _HiddenAndHead(torch.nn.Module):
    """A model's final hidden state and output head as one module's output, for ``functional_call``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.hidden(inputs), self.model.head_weight


class MicroBatchContext:
    """What an engine is given for the micro-batches of one operator (module docstring).

    ``model``, ``precision``, ``flat`` (the parameters' flat layout), ``n_targets`` (the epoch's
    target tokens, the mean's denominator; ``n_targets_tensor`` the same as a 0-dim input of a
    compiled graph), ``head_tokens`` (the head and loss that many target positions at a time, where
    ``head_chunked``), ``compile``, ``fd_scale`` and ``theta_norm`` (the finite differences' step),
    ``workspace`` (buffers the jet engines keep between groups) and ``functions`` (what an engine
    builds once per operator: the compiled Pearlmutter product)."""

    def __init__(self, model: torch.nn.Module, placement: Placement, precision: Precision, n_targets: int,
                 head_tokens: int | None = None, compile: bool = False):  # fmt: skip
        self.model, self.precision, self.n_targets = model, precision, n_targets
        self.head_tokens, self.compile = head_tokens, compile
        self._placement = placement
        self.flat = FlatParameters(model)
        theta = placement.flatten([p.detach() for p in model.parameters()])
        self.theta_norm = placement.norms(theta[None])[0]  # the finite differences' step scale
        self.n_targets_tensor = torch.tensor(float(n_targets), dtype=precision.dtype, device=precision.device)
        self.fd_scale = FD_SCALE.get(precision.dtype, 3e-3)
        self.workspace: dict[str, torch.Tensor] = {}
        self.functions: dict[str, Callable] = {}
        self._hidden_and_head: _HiddenAndHead | None = None

    @functools.cached_property
    def theta(self) -> torch.Tensor:
        """θ as one flat vector, as this placement holds it, made on first use (the Pearlmutter
        product's point): the engines that do not ask hold no copy of the parameters."""
        return self._placement.flatten([p.detach() for p in self.model.parameters()])

    def loss(
        self,
        params: dict[str, torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        n_targets: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This micro-batch's share of the epoch loss at ``params`` (a functional call)."""
        logits = self.precision.forward(lambda x: functional_call(self.model, params, (x,)), inputs)
        return token_losses(logits, targets).sum() / (self.n_targets if n_targets is None else n_targets)

    def hidden_and_head(
        self, params: dict[str, torch.Tensor], inputs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The final hidden state (B, T, C) and the output head (V, C) at ``params`` (a functional
        call of a model of this project's, under the forward's autocast)."""
        if self._hidden_and_head is None:
            self._hidden_and_head = _HiddenAndHead(self.model)
        with self.precision.autocast():
            return functional_call(self._hidden_and_head, {f"model.{n}": p for n, p in params.items()}, (inputs,))

    def head_chunked(self, targets: torch.Tensor) -> bool:
        """Whether this group's head and loss run in token chunks: ``head_tokens`` set, fewer than
        the group's targets, a model with second-order rules (which has ``hidden``) and a placement
        that allows it (``Placement.head_chunks``)."""
        chunks = self.head_tokens is not None and self.head_tokens < targets.numel()
        return chunks and self._placement.head_chunks and jet_rules(self.model)

    def gradient_at(
        self, inputs: torch.Tensor, targets: torch.Tensor, step: torch.Tensor | None = None
    ) -> torch.Tensor:
        """∇ of this micro-batch's share of the epoch loss at θ + ``step`` (None: at θ; the placement
        shifts and restores θ), as this placement holds vectors (a rank's shard when sharded: FSDP
        reduce-scatters the gradient of every rank's micro-batch of the round). With
        ``head_tokens`` (``head_chunked``) the head and loss run that many target positions at a
        time: the same sums."""
        model = self.model
        head_tokens = self.head_tokens if self.head_chunked(targets) else None
        with self._placement.shifted(step):
            model.zero_grad(set_to_none=True)
            micro_batch_gradient(model, inputs, targets, self.n_targets, self.precision, head_tokens)
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
            gradient = self._placement.flatten(grads)
            model.zero_grad(set_to_none=True)
        return gradient

    def jet_pass(self, V: torch.Tensor, adjoints: dict | None) -> contextlib.AbstractContextManager:
        """The jet pass of K directions V (K, d) as the placement gives it, and the loss rule to end
        it with (``Placement.jet_pass``: a sharded model's directions gathered block by block)."""
        return self._placement.jet_pass(V, adjoints, self.workspace, self.head_tokens)

    def norms(self, V: torch.Tensor) -> list[float]:
        """The whole vectors' norms of the rows of V (K, d), as the placement holds them."""
        return self._placement.norms(V)
