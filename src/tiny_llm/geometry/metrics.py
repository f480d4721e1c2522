"""Geometry of one parameter state on fixed reference batches, and its comparison across seeds.

The measurements of a cross-seed experiment: models trained from different initialisations on the
same data, probed at matched steps with the same reference batches (so that differences are
geometry, not probe noise). Everything here works on a ``Llama`` with reference attention and
(n, T+1) token rows; vectors are float64.

Per state (one seed at one step):

- :func:`reference_gradient`: ḡ, the token-mean gradient over every reference row, and the loss.
- :func:`batch_gradients`: G (m, D), the gradients of m disjoint reference batches (the
  covariance probe, ``cov_num_batches`` × ``cov_batch_size`` rows).
- :func:`concentration`: the eigenvalues of the covariance (1/m) Σᵢ (gᵢ − ḡ_G)(gᵢ − ḡ_G)ᵀ of
  those gradients (from the m × m centred Gram matrix), the share of the top k, and the
  effective rank exp(H(λ / Σλ)) (Roy & Vetterli 2007).
- :func:`function_gradients`: J gᵢ, each batch gradient's first-order effect on the reference
  logits (a Jacobian-vector product): the function-space image of the parameter gradients.
- :func:`cross_batch_cosine`: the mean cosine between the function-space effects of different
  batches' gradients (``function_update_cross_batch_cosine``).
- :func:`top_subspace`: the top-k left singular vectors of a set of vectors (parameter space: of G;
  function space: of the J gᵢ).
- :func:`hessian_trace`: Hutchinson's estimate of tr(H) with Rademacher probes, and its standard
  error.
- :func:`fisher_trace`: the empirical Fisher trace (1/n) Σ_s ‖∇ℓ_s‖², ℓ_s the token-mean loss of
  reference row s (per-row gradients by ``torch.func.vmap``).
- :func:`jacobian_frobenius`: ‖J‖²_F / P for the Jacobian J of the reference logits (P
  positions × vocabulary outputs) with respect to the parameters, by Hutchinson with
  vector-Jacobian products (E_u ‖Jᵀu‖² = ‖J‖²_F for Rademacher u), and its standard error.

- :func:`local_learning_coefficient`: the local learning coefficient (Lau et al. 2023) by SGLD
  sampling around the parameters, through the optional devinterp package (pinned; see the README).

Across seeds:

- :func:`cosine_matrix`: pairwise cosines (gradient alignment, function-update similarity).
- :func:`subspace_overlap`: ‖UᵀV‖²_F / k for two k-dimensional subspaces; two independent random
  subspaces of a d-dimensional space give k/d on average (:func:`random_overlap`).

Parameter-space comparisons across seeds are not invariant to the network's symmetries (permuted
hidden units give the same function and a different parameter vector); function-space ones are.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch.func import functional_call, grad, jvp, vjp, vmap

from tiny_llm.curvature.gradients import mean_gradient_and_loss
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.job import Cuts, open_job
from tiny_llm.curvature.vectors import rademacher
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama

__all__ = [
    "SGLD",
    "batch_gradients",
    "concentration",
    "cosine_matrix",
    "cross_batch_cosine",
    "fisher_trace",
    "function_gradients",
    "hessian_trace",
    "jacobian_frobenius",
    "local_learning_coefficient",
    "random_overlap",
    "reference_gradient",
    "subspace_overlap",
    "top_subspace",
]


def _theta(model: Llama, flat: FlatParameters) -> torch.Tensor:
    return flat.flatten([p.detach() for p in model.parameters()])


def _logits_of(model: Llama, flat: FlatParameters, inputs: torch.Tensor):
    def logits(theta: torch.Tensor) -> torch.Tensor:
        return functional_call(model, flat.unflatten(theta), (inputs,))

    return logits


def reference_gradient(
    model: Llama, rows: torch.Tensor, *, micro_batch_size: int, precision: Precision
) -> tuple[torch.Tensor, float]:
    """ḡ (D,) float64 and the loss: the token-mean over every target of ``rows`` (n, T+1)."""
    return mean_gradient_and_loss(model, FlatParameters(model), [rows], micro_batch_size, precision)


def batch_gradients(
    model: Llama, batches: list[torch.Tensor], *, micro_batch_size: int, precision: Precision
) -> torch.Tensor:
    """G (m, D) float64: row i is the token-mean gradient of ``batches[i]``."""
    flat = FlatParameters(model)
    return torch.stack(
        [mean_gradient_and_loss(model, flat, [rows], micro_batch_size, precision)[0] for rows in batches]
    )


def concentration(G: torch.Tensor, k: int) -> dict[str, float | list[float]]:
    """Eigenvalues (descending) of the covariance of the rows of G, the share of the top ``k``
    and the effective rank exp(−Σ pᵢ log pᵢ), pᵢ = λᵢ / Σλ (1 when one direction holds all of it,
    m − 1 at most). A zero covariance has share and effective rank None."""
    centred = G.double() - G.double().mean(dim=0)
    gram = centred @ centred.T / len(G)
    values = torch.linalg.eigvalsh(gram).flip(0).clamp(min=0)
    total = float(values.sum())
    if total == 0:
        return {"eigenvalues": values.tolist(), "top_k_share": None, "effective_rank": None}
    p = values[values > 0] / total
    return {
        "eigenvalues": values.tolist(),
        "top_k_share": float(values[:k].sum()) / total,
        "effective_rank": math.exp(float(-(p * p.log()).sum())),
    }


def function_gradients(model: Llama, directions: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """J v for each row v of ``directions`` (m, D): the first-order change of the reference logits
    (inputs of ``reference`` rows, (n, T+1)) along v, flattened to (m, n·T·vocab) float64."""
    flat = FlatParameters(model)
    theta = _theta(model, flat)
    logits = _logits_of(model, flat, reference[:, :-1])
    return torch.stack([jvp(logits, (theta,), (v.to(theta),))[1].reshape(-1).double() for v in directions])


def cosine_matrix(vectors: torch.Tensor) -> torch.Tensor:
    """Pairwise cosines of the rows (m, m); a zero row has cosine 0 with everything (and itself)."""
    v = vectors.double()
    norms = v.norm(dim=1)
    unit = v / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)
    return unit @ unit.T


def cross_batch_cosine(vectors: torch.Tensor) -> float:
    """Mean cosine over the pairs i < j of different rows."""
    if len(vectors) < 2:
        raise ValueError("the cross-batch cosine needs at least 2 batches")
    cos = cosine_matrix(vectors)
    i, j = torch.triu_indices(len(vectors), len(vectors), offset=1)
    return float(cos[i, j].mean())


def top_subspace(vectors: torch.Tensor, k: int) -> torch.Tensor:
    """An orthonormal basis (d, k) of the top-k subspace spanned by the rows of ``vectors`` (m, d):
    the left singular vectors of ``vectors``ᵀ with the k largest singular values."""
    if not 1 <= k <= min(vectors.shape):
        raise ValueError(f"k must be between 1 and {min(vectors.shape)} (vectors {tuple(vectors.shape)}), got {k}")
    U, _, _ = torch.linalg.svd(vectors.double().T, full_matrices=False)
    return U[:, :k]


def subspace_overlap(U: torch.Tensor, V: torch.Tensor) -> float:
    """‖UᵀV‖²_F / k for orthonormal bases U, V (d, k): 1 for the same subspace, 0 for orthogonal ones."""
    if U.shape != V.shape:
        raise ValueError(f"subspaces of different shapes: {tuple(U.shape)} and {tuple(V.shape)}")
    return float((U.double().T @ V.double()).square().sum()) / U.shape[1]


def random_overlap(d: int, k: int) -> float:
    """The expected overlap of two independent uniformly random k-dimensional subspaces of R^d: k/d."""
    return k / d


def hessian_trace(
    model: Llama,
    rows: torch.Tensor,
    samples: int,
    *,
    seed: int,
    batch_size: int,
    precision: Precision,
    engine: str = "adjoint",
) -> tuple[float, float]:
    """Hutchinson's tr(H) ≈ (1/S) Σ vₛᵀHvₛ for the token-mean Hessian over ``rows``, with S
    Rademacher probes (reproducible from ``seed``); returns (estimate, standard error s/√S)."""
    H = open_job(model, [rows], Cuts(batch_size, batch_size, min(samples, 8)), precision).operator(engine)
    V = torch.stack([rademacher(H.flat.D, seed, i) for i in range(samples)]).to(precision.device, precision.dtype)
    forms = H.quadratic_forms(V).double()
    return float(forms.mean()), (float(forms.std()) / math.sqrt(samples) if samples > 1 else math.nan)


def fisher_trace(model: Llama, rows: torch.Tensor) -> float:
    """Empirical Fisher trace (1/n) Σ_s ‖∇θ ℓ_s‖², ℓ_s the token-mean loss of row s of ``rows``."""
    flat = FlatParameters(model)
    params = {name: p.detach() for name, p in zip(flat.names, model.parameters(), strict=True)}

    def row_loss(parameters: dict, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, parameters, (inputs.unsqueeze(0),))
        return token_losses(logits, targets.unsqueeze(0)).mean()

    gradients = vmap(grad(row_loss), in_dims=(None, 0, 0))(params, rows[:, :-1], rows[:, 1:])
    return float(sum(g.double().square().sum() for g in gradients.values())) / len(rows)


def jacobian_frobenius(model: Llama, rows: torch.Tensor, samples: int, *, seed: int) -> tuple[float, float]:
    """‖J‖²_F / P for the Jacobian of the logits of ``rows``' inputs (P = positions × vocabulary
    outputs) by Hutchinson with S Rademacher probes u in logit space, ‖Jᵀu‖² each; returns
    (estimate, standard error)."""
    flat = FlatParameters(model)
    theta = _theta(model, flat)
    logits, pullback = vjp(_logits_of(model, flat, rows[:, :-1]), theta)
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(samples):
        u = (torch.randint(0, 2, logits.shape, generator=generator) * 2 - 1).to(logits)
        values.append(float(pullback(u)[0].double().square().sum()) / logits.numel())
    mean = sum(values) / samples
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (samples - 1)) if samples > 1 else math.nan
    return mean, spread / math.sqrt(samples)


@dataclass(frozen=True)
class SGLD:
    """The sampler of the local learning coefficient (devinterp 2.0.1's SGLD): ``chains`` chains of
    ``draws`` draws, step size ``lr``, inverse temperature ``n_beta`` (None: N / ln N for the N
    reference tokens), pull ``localization`` towards the parameters."""

    chains: int
    draws: int
    lr: float = 1e-4
    n_beta: float | None = None
    localization: float = 100.0


def local_learning_coefficient(
    model: Llama, rows: torch.Tensor, sampler: SGLD, *, batch_size: int, seed: int
) -> tuple[float, float]:
    """The local learning coefficient of the token-mean loss on ``rows`` at the model's parameters,
    by ``sampler`` (micro-batches of ``batch_size`` rows, chains seeded by ``seed``). The model is
    copied, not changed. Returns (mean over chains, standard error over chains).

    Raises:
        ValueError: devinterp is not installed (the message says how to install it).
    """
    try:
        from datasets import Dataset
        from devinterp.slt.llc import llc
    except ImportError:
        raise ValueError(
            "the local learning coefficient needs devinterp 2.0.1: pip install "
            "'tiny-llm-curvature[llc]' (or make test-llc), or set llc_every: 0"
        ) from None
    tokens = rows[:, 1:].numel()
    beta = sampler.n_beta if sampler.n_beta is not None else tokens / math.log(tokens)
    data = Dataset.from_dict({"input_ids": rows.cpu().tolist()}).with_format("torch")
    sampled = copy.deepcopy(model)
    device = str(next(model.parameters()).device)

    def per_token_loss(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return token_losses(module(ids[:, :-1]), ids[:, 1:])

    out = llc(
        sampled,
        data,
        {},
        lr=sampler.lr,
        n_beta=beta,
        loss_fn=per_token_loss,
        num_chains=sampler.chains,
        num_draws=sampler.draws,
        batch_size=min(batch_size, len(rows)),
        num_init_loss_batches=max(1, len(rows) // batch_size),
        localization=sampler.localization,
        init_seed=seed,
        device=device,
    )
    per_chain = [float(v) for v in out["llc_per_chain"].values]
    mean = sum(per_chain) / len(per_chain)
    spread = (
        math.sqrt(sum((v - mean) ** 2 for v in per_chain) / (len(per_chain) - 1)) if len(per_chain) > 1 else math.nan
    )
    return mean, spread / math.sqrt(len(per_chain))
