"""The batch computations of the quadratic-form engines (taylor, adjoint): vᵀH_b v and its
generalised Gauss–Newton part vᵀG_b v for one group of sequences, without Hessian-vector products.

vᵀHv is the second derivative d²/dt² L(θ + t v) at t = 0. Both engines push each direction's jet
through the model's second-order rules (``tiny_llm.model.jets`` and the layers beside it):

* ``taylor``: one forward pass under ``no_grad`` carrying each activation's jet (z0, z1, z2) =
  (z, dz/dt, d²z/dt²), the primal shared by the K directions, to the loss's second derivative.
* ``adjoint``: one ordinary forward and reverse pass give the adjoint λ = ∂L/∂y of every layer
  output y (no parameter gradients), shared by the K directions; a first-order tangent pass then
  computes each layer's own second-order term Q (its z2 with zero second-order input) and adds
  ⟨λ, Q⟩, since that term reaches the loss linearly. Per linear layer and direction: three matmuls
  (x1Wᵀ, x0Vᵀ, x1Vᵀ), the cost of a gradient, with the forward and reverse pass paid once for all K.

The loss rule computes vᵀGv on its way to vᵀHv, so the split costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tiny_llm.model.causal import head_loss_chunks, token_losses
from tiny_llm.model.jets import JetPass

if TYPE_CHECKING:
    from tiny_llm.curvature.context import MicroBatchContext

__all__ = ["adjoint", "taylor"]


def taylor(context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(2, K): the forms and their Gauss–Newton parts by forward Taylor mode."""
    return _jet_forms(context, V, inputs, targets, None)


def adjoint(context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(2, K): the forms and their Gauss–Newton parts by the adjoint mode (one record pass, then
    a tangent pass that adds every layer's ⟨λ, Q⟩)."""
    return _jet_forms(context, V, inputs, targets, _adjoints(context, inputs, targets))


def _adjoints(context: MicroBatchContext, inputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """λ = ∂L_b/∂y for the output y of every node of the jet rules: a primal jet pass (zero
    directions) under autograd, then one reverse pass to those outputs (no parameter gradients).
    With ``head_tokens`` the head and loss are differentiated chunk by chunk first, and the reverse
    pass starts from the final hidden state with that gradient."""
    model = context.model
    jets = JetPass({p: p.new_zeros(0, *p.shape) for p in model.parameters()}, record=True)
    with torch.enable_grad(), context.precision.autocast():
        h = model.jet(inputs, jets)
        unique = list({id(t): t for t in jets.recorded.values()}.values())
        if context.head_tokens is None or context.head_tokens >= targets.numel():
            loss = token_losses(model.logits(h.z0), targets).sum() / context.n_targets
            outputs, seeds = loss, None
        else:
            scale = 1 / context.n_targets
            outputs, seeds = h.z0, head_loss_chunks(model, h.z0, targets, scale, context.head_tokens, False)[1]
    keys = list(jets.recorded)
    gradients = torch.autograd.grad(outputs, unique, grad_outputs=seeds, materialize_grads=True)
    grads = dict(zip(map(id, unique), gradients, strict=True))
    return {key: grads[id(jets.recorded[key])] for key in keys}


def _jet_forms(
    context: MicroBatchContext, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor, adjoints: dict | None
) -> torch.Tensor:
    """(2, K): the forms and their Gauss–Newton parts (the adjoint mode's absorbed terms are all
    second-order terms of the network, so of the residual H − G). The placement gives the jets their
    directions (a sharded model's gathered block by block) and the loss rule."""
    model = context.model
    with context.jet_pass(V, adjoints) as (jets, loss_jet):
        with torch.no_grad(), context.precision.autocast():
            forms = loss_jet(model.jet(inputs, jets), targets, jets).double() / context.n_targets
    gauss_newton = jets.gauss_newton.double() / context.n_targets
    return torch.stack([forms if jets.absorbed is None else forms + jets.absorbed.double(), gauss_newton])
