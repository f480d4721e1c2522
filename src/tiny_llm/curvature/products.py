"""The batch computations of the Hessian-vector-product engines: H_b V for one group of
sequences, V of shape (K, D).

* ``double_backward``: eager reverse-over-reverse; K directions through one batched vjp
  (``torch.autograd.grad(..., is_grads_batched=True)``).
* ``pearlmutter``: forward-over-reverse ``jvp(grad(L))`` with ``torch.func``, vmapped over the
  K directions; compiled with ``torch.compile`` when the operator is (CUDA), eager otherwise.
* ``finite_difference``: central differences of gradients (first derivatives only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.func import grad, jvp, vmap

if TYPE_CHECKING:
    from tiny_llm.curvature.hessian import EpochHessian

__all__ = ["double_backward", "finite_difference", "pearlmutter"]


def double_backward(
    hessian: EpochHessian, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """H_b V by reverse-over-reverse (one batched vjp for the K directions)."""
    params = tuple(hessian.model.parameters())
    loss = hessian.loss(dict(zip(hessian.flat.names, params, strict=True)), inputs, targets)
    gradient = hessian.flat.flatten(torch.autograd.grad(loss, params, create_graph=True))
    if len(V) == 1:
        products = torch.autograd.grad(gradient, params, grad_outputs=V[0])
        return hessian.flat.flatten(products).unsqueeze(0)
    products = torch.autograd.grad(gradient, params, grad_outputs=V, is_grads_batched=True)
    return torch.cat([p.reshape(len(V), -1) for p in products], dim=1)


def pearlmutter(hessian: EpochHessian, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """H_b V by forward-over-reverse; the operator's compiled graph when it is compiled."""
    product = hessian.functions.get("pearlmutter")
    if product is None:

        def product(theta, V, inputs, targets, n_targets):
            return _pearlmutter(hessian, theta, V, inputs, targets, n_targets)

        if hessian.compile:
            product = torch.compile(product, dynamic=False)
        hessian.functions["pearlmutter"] = product
    return product(hessian.theta, V, inputs, targets, hessian.n_targets_tensor)


def _pearlmutter(
    hessian: EpochHessian,
    theta: torch.Tensor,
    V: torch.Tensor,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    n_targets: torch.Tensor,
) -> torch.Tensor:
    """``n_targets`` (a 0-dim tensor) is an input, so a compiled graph does not depend on the
    epoch's target count (another epoch or audit sample reuses it)."""

    def loss(flat: torch.Tensor) -> torch.Tensor:
        return hessian.loss(hessian.flat.unflatten(flat), inputs, targets, n_targets)

    def product(v: torch.Tensor) -> torch.Tensor:
        return jvp(grad(loss), (theta,), (v,))[1]

    if len(V) == 1:  # vmap over a single direction only adds overhead
        return product(V[0]).unsqueeze(0)
    return vmap(product)(V)


def finite_difference(
    hessian: EpochHessian, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Central differences of gradients, (∇L(θ + εv) − ∇L(θ − εv)) / 2ε, with
    ε = fd_scale · max(1, ‖θ‖) / ‖v‖: first derivatives only, so fused attention works."""

    def loss(flat: torch.Tensor) -> torch.Tensor:
        return hessian.loss(hessian.flat.unflatten(flat), inputs, targets)

    gradient = grad(loss)
    scale = hessian.fd_scale * max(1.0, float(hessian.theta.norm()))
    rows = []
    for v in V:
        norm = float(v.norm())
        if norm == 0:
            rows.append(torch.zeros_like(v))
            continue
        eps = scale / norm
        rows.append((gradient(hessian.theta + eps * v) - gradient(hessian.theta - eps * v)) / (2 * eps))
    return torch.stack(rows)
