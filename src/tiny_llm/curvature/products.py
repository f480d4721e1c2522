"""The batch computations of the Hessian-vector-product engines: H_b V for one group of
sequences, V of shape (K, D).

* ``double_backward``: eager reverse-over-reverse; K directions through one batched vjp
  (``torch.autograd.grad(..., is_grads_batched=True)``).
* ``pearlmutter``: forward-over-reverse ``jvp(grad(L))`` with ``torch.func``, vmapped over the
  K directions; compiled with ``torch.compile`` when the operator is (CUDA), eager otherwise.
* ``finite_difference``: central differences of gradients (first derivatives only).

With the operator's ``head_tokens`` (a model of this project's, which has ``hidden``) every engine
takes the output head and loss that many target positions at a time
(:mod:`tiny_llm.curvature.head`): only one chunk's logits and their derivatives exist at once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch.func import grad, jvp, vjp, vmap

from tiny_llm.curvature.head import head_gradient, head_loss

if TYPE_CHECKING:
    from tiny_llm.curvature.context import MicroBatchContext

__all__ = ["central_differences", "double_backward", "finite_difference", "pearlmutter"]


def double_backward(
    context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """H_b V by reverse-over-reverse (one batched vjp for the K directions); with the operator's
    ``head_tokens``, the head and loss an autograd function that takes them in token chunks in
    the forward pass and in both derivatives."""
    params = tuple(context.model.parameters())
    if context.head_chunked(targets):
        with context.precision.autocast():
            h = context.model.hidden(inputs)
            loss = head_loss(h, context.model.head_weight, targets, 1 / context.n_targets, context.head_tokens)
    else:
        loss = context.loss(dict(zip(context.flat.names, params, strict=True)), inputs, targets)
    gradient = context.flat.flatten(torch.autograd.grad(loss, params, create_graph=True))
    if len(V) == 1:
        products = torch.autograd.grad(gradient, params, grad_outputs=V[0])
        return context.flat.flatten(products).unsqueeze(0)
    products = torch.autograd.grad(gradient, params, grad_outputs=V, is_grads_batched=True)
    return torch.cat([p.reshape(len(V), -1) for p in products], dim=1)


def pearlmutter(
    context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """H_b V by forward-over-reverse; the operator's compiled graph when it is compiled."""
    product = context.functions.get("pearlmutter")
    if product is None:

        def product(theta, V, inputs, targets, n_targets):
            return _pearlmutter(context, theta, V, inputs, targets, n_targets)

        if context.compile:
            product = torch.compile(product, dynamic=False)
        context.functions["pearlmutter"] = product
    return product(context.theta, V, inputs, targets, context.n_targets_tensor)


def _pearlmutter(
    context: MicroBatchContext,
    theta: torch.Tensor,
    V: torch.Tensor,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    n_targets: torch.Tensor,
) -> torch.Tensor:
    """``n_targets`` (a 0-dim tensor) is an input, so a compiled graph does not depend on the
    epoch's target count (another epoch or audit sample reuses it)."""

    def loss(flat: torch.Tensor) -> torch.Tensor:
        return context.loss(context.flat.unflatten(flat), inputs, targets, n_targets)

    def chunked_gradient(flat: torch.Tensor) -> torch.Tensor:  # the head in token chunks
        (h, W), pullback = vjp(lambda f: context.hidden_and_head(context.flat.unflatten(f), inputs), flat)
        with context.precision.autocast():
            grads = head_gradient(h, W, targets, 1 / n_targets, context.head_tokens)
        return pullback(grads)[0]

    gradient = chunked_gradient if context.head_chunked(targets) else grad(loss)

    def product(v: torch.Tensor) -> torch.Tensor:
        return jvp(gradient, (theta,), (v,))[1]

    if len(V) == 1:  # vmap over a single direction only adds overhead
        return product(V[0]).unsqueeze(0)
    return vmap(product)(V)


def finite_difference(
    context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Central differences of gradients, (∇L(θ + εv) − ∇L(θ − εv)) / 2ε, with
    ε = fd_scale · max(1, ‖θ‖) / ‖v‖ (whole vectors' norms): first derivatives only, so fused
    attention works, and each rank of a sharded model moves its own shard of θ and reads its shard of
    the reduce-scattered gradient (``MicroBatchContext.gradient_at``, the placement's shift). With the
    operator's ``head_tokens`` each gradient takes the head and loss that many target positions at a
    time: the same sums."""
    scale = context.fd_scale * max(1.0, context.theta_norm)
    return central_differences(partial(context.gradient_at, inputs, targets), V, context.norms(V), scale)


def central_differences(
    gradient_at: Callable[[torch.Tensor], torch.Tensor], V: torch.Tensor, norms: list[float], scale: float
) -> torch.Tensor:
    """(∇L(θ + εv) − ∇L(θ − εv)) / 2ε for each row v of V, ε = scale / ‖v‖, where ``gradient_at(s)``
    is the gradient at θ + s and ``norms`` the rows' norms (the whole vectors', when V holds a rank's
    shards); a zero row gives zeros. The one rule of the whole-model and the sharded engines (the
    step's scale is ``fd_scale · max(1, ‖θ‖)`` in both)."""
    rows = []
    for v, norm in zip(V, norms, strict=True):
        if norm == 0:
            rows.append(torch.zeros_like(v))
            continue
        eps = scale / norm
        step = eps * v
        rows.append((gradient_at(step) - gradient_at(-step)) / (2 * eps))
    return torch.stack(rows)
