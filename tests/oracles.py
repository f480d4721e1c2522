"""Exact references for the tests: the tiny float64 model, its dense Hessian and Gauss–Newton
matrix (torch.func), jet-rule checks against forward mode twice, and the engines under test (from
the registry, so a new engine is tested where its kind is)."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, hessian, jvp

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.engines import ENGINES, names
from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.model.causal import token_losses
from tiny_llm.model.jets import Jet, JetPass
from tiny_llm.model.llama import Llama
from tiny_llm.model.moments import moments_from_optimizer, preconditioner

FORM_ENGINES = names("forms")
"""Engines of quadratic forms (exact, with the Gauss–Newton split)."""
PRODUCT_ENGINES = names("products")
"""Engines of Hessian-vector products."""
EXACT_PRODUCT_ENGINES = tuple(name for name in PRODUCT_ENGINES if ENGINES[name].second_derivatives)
"""Hessian-vector-product engines exact to rounding (not finite differences)."""
EXACT_ENGINES = FORM_ENGINES + EXACT_PRODUCT_ENGINES
"""Every engine exact to rounding."""

TINY_MODEL = ModelConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_seq_len=8)


def dense_model() -> Llama:
    """The dense problem's model: TINY_MODEL in float64, seeded (the same weights every call)."""
    torch.manual_seed(0)
    return Llama(TINY_MODEL, attention_backend="reference").double()


def dense_tokens() -> torch.Tensor:
    """The dense problem's epoch: 7 rows of 7 tokens (uneven for every batch size)."""
    return torch.randint(0, 16, (7, 7), generator=torch.Generator().manual_seed(2))


def dense_directions(D: int) -> torch.Tensor:
    """Three seeded float64 directions of the dense problem."""
    return torch.randn(3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def dense_epoch_hessian(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """The dense oracle: the explicit (D, D) Hessian of the token-mean loss over ``tokens`` (n, T+1)
    at the model's parameters, in FlatParameters order (``torch.func.hessian``)."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def loss(x):
        logits = functional_call(model, flat.unflatten(x), (tokens[:, :-1],))
        return token_losses(logits, tokens[:, 1:]).mean()

    return hessian(loss)(theta)


def dense_gauss_newton(model, tokens, ignored=()):
    """The dense generalised Gauss–Newton matrix G = Jᵀ (∇²ℓ) J of the token-mean loss, with J the
    Jacobian of the logits (torch.func.jacrev) and ∇²ℓ = (diag(p) − ppᵀ)/N per kept target."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    J = torch.func.jacrev(lambda x: functional_call(model, flat.unflatten(x), (inputs,)))(theta)  # (n, T, V, D)
    logits = functional_call(model, flat.unflatten(theta), (inputs,)).detach()
    p = torch.softmax(logits, dim=-1)
    keep = torch.ones(targets.shape, dtype=torch.float64)
    for row, column in ignored:
        keep[row, column] = 0
    H_out = (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) * keep[..., None, None] / keep.sum()
    return torch.einsum("ntvd,ntvw,ntwe->de", J, H_out, J)


JET_K = 3
"""Directions per jet-rule check."""


def jet_generator(seed):
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def jet_randn(*shape, seed):
    """A float64 standard normal tensor from ``jet_generator(seed)``."""
    return torch.randn(*shape, dtype=torch.float64, generator=jet_generator(seed))


def reference_jet(f, x0, x1, x2):
    """(y1, y2) of t ↦ f(t, x0 + t·x1 + ½t²·x2) at t = 0, by forward mode twice (torch.func)."""

    def path(t):
        return f(t, x0 + t * x1 + 0.5 * t * t * x2)

    def first(t):
        return jvp(path, (t,), (torch.ones((), dtype=torch.float64),))[1]

    zero = torch.zeros((), dtype=torch.float64)
    return first(zero), jvp(first, (zero,), (torch.ones((), dtype=torch.float64),))[1]


def check_module_jet(module, jet_of, x0, *, second_order_input=True, seed=0):
    """Module rule vs torch.func for K directions of its parameters and input."""
    module = module.double()
    names = [n for n, _ in module.named_parameters()]
    dirs = {n: jet_randn(JET_K, *p.shape, seed=seed + i) for i, (n, p) in enumerate(module.named_parameters())}
    x1 = jet_randn(JET_K, *x0.shape, seed=seed + 50)
    x2 = (
        jet_randn(JET_K, *x0.shape, seed=seed + 60)
        if second_order_input
        else torch.zeros(JET_K, *x0.shape, dtype=torch.float64)
    )
    jets = JetPass({p: dirs[n] for n, p in module.named_parameters()})
    out = jet_of(module, Jet(x0, x1, x2 if second_order_input else None), jets)
    for k in range(JET_K):

        def f(t, x, k=k):
            params = {n: p + t * dirs[n][k] for n, p in zip(names, module.parameters(), strict=True)}
            return functional_call(module, params, (x,))

        y1, y2 = reference_jet(f, x0, x1[k], x2[k])
        torch.testing.assert_close(
            out.z0, functional_call(module, dict(module.named_parameters()), (x0,)), rtol=0, atol=1e-13
        )
        torch.testing.assert_close(out.z1[k], y1, rtol=0, atol=1e-11)
        torch.testing.assert_close(out.z2[k], y2, rtol=0, atol=1e-11)


def check_whole_model_jet(model) -> None:
    """model.jet + loss_jet in Taylor mode = d²/dt² of the summed loss along θ + t v (torch.func jvp
    of jvp) for JET_K directions, with ignored targets."""
    inputs = torch.randint(0, 16, (3, 6), generator=jet_generator(40))
    targets = torch.randint(0, 16, (3, 6), generator=jet_generator(41))
    targets[1, 2:4] = -100
    jets = JetPass({p: jet_randn(JET_K, *p.shape, seed=i) for i, p in enumerate(model.parameters())})
    with torch.no_grad():
        taylor = model.loss_jet(model.jet(inputs, jets), targets, jets)
    names = [n for n, _ in model.named_parameters()]
    for k in range(JET_K):

        def f(t, _, k=k):
            params = {n: p + t * jets.directions[p][k] for n, p in zip(names, model.parameters(), strict=True)}
            return token_losses(functional_call(model, params, (inputs,)), targets).sum()

        _, second = reference_jet(f, torch.zeros(()), torch.zeros(()), torch.zeros(()))
        assert float(taylor[k]) == pytest.approx(float(second.detach()), rel=1e-11, abs=1e-11)


def adam_diagonal(model, batches: list[torch.Tensor], steps: int = 3) -> torch.Tensor:
    """P's diagonal in FlatParameters order, from a real AdamW state: a copy of ``model`` trained
    ``steps`` steps (two groups, decayed matrices first, as training here groups them)."""
    copy = build_model(model.config, attention_backend="reference").double()
    copy.load_state_dict(model.state_dict())
    named = list(copy.named_parameters())
    groups = [
        {
            "params": [p for _, p in named if (p.dim() >= 2) == d],
            "param_names": [n for n, p in named if (p.dim() >= 2) == d],
        }
        for d in (True, False)
    ]
    optimizer = torch.optim.AdamW(groups, lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(steps):
        rows = batches[step % len(batches)]
        optimizer.zero_grad()
        token_losses(copy(rows[:, :-1]), rows[:, 1:]).mean().backward()
        optimizer.step()
    moments = moments_from_optimizer(optimizer.state_dict())
    assert moments.step == steps
    p = preconditioner(moments)
    return FlatParameters(model).flatten([p[n] for n in FlatParameters(model).names])
