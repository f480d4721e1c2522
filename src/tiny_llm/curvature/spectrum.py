"""Hessian spectra and solves on the one curvature operator (``EpochHessian.hvp``).

Every method here takes ``matvec``: a function mapping directions (K, D) to H·directions (K, D)
in float64, so Lanczos, stochastic Lanczos quadrature, conjugate gradients and the block-diagonal
comparison all run on the same full-epoch, token-weighted operator and engines as the noise
statistics (never a private second implementation).

Vectors may also be sharded: with a ``Layout`` of this rank's entries (FSDP-sharded parameters),
every vector a method holds is this rank's part only, ``matvec`` maps parts to parts, and every
inner product and norm is a local sum all-reduced over the ranks (one reduction per
reorthogonalisation sweep, in the reduction dtype). Random starting vectors are the ones a single
process draws, so a sharded run follows the same Krylov sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.curvature.vectors import Layout, gaussians, signs

__all__ = [
    "FLOAT64",
    "Basis",
    "LanczosResult",
    "block_diagonal_error",
    "conjugate_gradient",
    "lanczos",
    "layer_blocks",
    "slq",
    "slq_density",
    "tensor_blocks",
    "top_eigenpairs",
]

MatVec = Callable[[torch.Tensor], torch.Tensor]


def _whole(D: int, layout: Layout | None) -> Layout:
    return layout if layout is not None else Layout(D)


@dataclass(frozen=True)
class Basis:
    """How a Lanczos basis is held: its vectors stored in ``dtype`` (bf16 halves their memory; bf16
    Lanczos vectors are known to suffice for Hessian spectra at foundation-model scale), their
    projections and norms in ``reduction``, on ``device``, and ``layout`` the entries this rank
    holds (None: every entry)."""

    dtype: torch.dtype = torch.float64
    reduction: torch.dtype = torch.float64
    device: str | torch.device = "cpu"
    layout: Layout | None = None


FLOAT64 = Basis()
"""A float64 basis of every entry on the CPU."""


@dataclass
class LanczosResult:
    """Tridiagonal coefficients and the (possibly low-precision) orthonormal basis Q (m, D)."""

    alpha: torch.Tensor  # (m,) float64
    beta: torch.Tensor  # (m - 1,) float64
    basis: torch.Tensor  # (m, D) in the basis dtype

    def tridiagonal(self) -> torch.Tensor:
        T = torch.diag(self.alpha)
        if len(self.beta):
            T += torch.diag(self.beta, 1) + torch.diag(self.beta, -1)
        return T


def lanczos(
    matvec: MatVec,
    start: torch.Tensor,
    steps: int,
    *,
    basis: Basis = FLOAT64,
    breakdown: float = 1e-12,
    done: Callable[[LanczosResult, float], bool] | None = None,
) -> LanczosResult:
    """Up to ``steps`` Lanczos iterations from ``start`` with full reorthogonalisation, the basis
    held as ``basis`` says (on ``start``'s device). Stops early at an invariant subspace (β below
    ``breakdown``·‖H‖), or when ``done(result so far, next β)`` says the wanted Ritz pairs have
    converged. With a sharded layout, ``start`` and the basis are this rank's parts.
    """
    layout = _whole(start.size(-1), basis.layout)
    basis_dtype, reduction_dtype = basis.dtype, basis.reduction
    q = (start / layout.norms(start.unsqueeze(0))[0]).to(reduction_dtype)
    stored_basis = torch.empty(steps, start.size(-1), dtype=basis_dtype, device=start.device)  # the only copy
    alphas, betas = [], []
    scale = 0.0
    for j in range(steps):
        stored_basis[j] = q
        stored = stored_basis[j]
        w = matvec(stored.to(torch.float64).unsqueeze(0))[0].to(reduction_dtype)
        alpha = layout.dots(stored.to(reduction_dtype).unsqueeze(0), w.unsqueeze(0))[0]
        alphas.append(float(alpha))
        Q = stored_basis[: j + 1].to(reduction_dtype)  # a view when the basis is stored in the reduction dtype
        for _ in range(2):  # classical Gram–Schmidt twice is enough (Kahan–Parlett); one reduction a sweep
            w = w - layout.reduce(Q @ w) @ Q
        del Q
        beta = float(layout.norms(w.unsqueeze(0))[0])
        scale = max(scale, abs(alphas[-1]), beta)
        if j + 1 == steps or beta <= breakdown * max(scale, 1e-300):
            break
        if done is not None and done(
            LanczosResult(
                torch.tensor(alphas, dtype=torch.float64),
                torch.tensor(betas, dtype=torch.float64),
                stored_basis[: j + 1],
            ),
            beta,
        ):
            break
        betas.append(beta)
        q = w / beta
    return LanczosResult(
        torch.tensor(alphas, dtype=torch.float64), torch.tensor(betas, dtype=torch.float64), stored_basis[: len(alphas)]
    )


def _wanted(theta: torch.Tensor, kind: str, k: int) -> torch.Tensor:
    """Indices of the k wanted Ritz values: largest algebraic (LA) or largest magnitude (LM)."""
    return torch.argsort(theta if kind == "LA" else theta.abs(), descending=True)[:k]


def top_eigenpairs(
    matvec: MatVec,
    D: int,
    k: int,
    steps: int,
    *,
    seed: int = 0,
    which: str | tuple[str, ...] = "LA",
    basis: Basis = FLOAT64,
    tolerance: float | None = None,
):  # 8 parameters: eigsh's (k, which, tol and the start's seed) beside the operator, its size and the basis
    """The k largest-algebraic (``LA``) or largest-magnitude (``LM``) eigenpairs from Lanczos.

    With ``tolerance``, Lanczos stops as soon as every wanted Ritz pair's residual estimate
    |β·s_m| is at most ``tolerance``·|θ| (at most ``steps`` iterations); without it, it runs
    ``steps``. Returns ``(eigenvalues (k,), eigenvectors (k, D), residuals (k,), converged (k,))``
    with honest residual norms ‖Hu − λu‖ from one more application of H, and ``converged`` when
    that residual is at most ``tolerance``·|λ| (all False without a tolerance). With
    ``which=("LA", "LM")`` one Lanczos run serves both, and a dict of such tuples is returned. With a
    sharded layout (``basis.layout``) the eigenvectors are this rank's parts.
    """
    layout, device = _whole(D, basis.layout), basis.device
    kinds = (which,) if isinstance(which, str) else tuple(which)
    if any(kind not in ("LA", "LM") for kind in kinds):
        raise ValueError(f"which: expected 'LA' or 'LM', got {which!r}")

    def done(result: LanczosResult, beta: float) -> bool:
        if tolerance is None or len(result.alpha) < k:
            return False
        theta, S = torch.linalg.eigh(result.tridiagonal())
        return all(
            bool((beta * S[-1, i].abs() <= tolerance * theta[i].abs()).all())
            for i in (_wanted(theta, kind, k) for kind in kinds)
        )

    start = gaussians(torch.Generator().manual_seed(seed), D, layout.indices).to(device)  # a rank draws its entries
    result = lanczos(matvec, start, steps, basis=basis, done=done)
    theta, S = torch.linalg.eigh(result.tridiagonal())
    pairs = {}
    for kind in kinds:
        order = _wanted(theta, kind, k)
        values = theta[order]
        combined = torch.promote_types(result.basis.dtype, torch.float32)  # no float64 copy of a float32 basis
        vectors = (S[:, order].T.to(device, combined) @ result.basis.to(combined)).double()  # (k, D)
        vectors = vectors / layout.norms(vectors)[:, None]
        residuals = layout.norms(matvec(vectors) - values.to(device)[:, None] * vectors).cpu()
        converged = (
            (residuals <= tolerance * values.abs())
            if tolerance is not None
            else torch.zeros(len(values), dtype=torch.bool)
        )
        pairs[kind] = (values, vectors, residuals, converged)
    return pairs[which] if isinstance(which, str) else pairs


def slq(
    matvec: MatVec,
    D: int,
    n_vectors: int,
    steps: int,
    *,
    seed: int = 0,
    basis: Basis = FLOAT64,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stochastic Lanczos quadrature (Ghorbani et al. 2019; Papyan): for each of ``n_vectors``
    Rademacher starts, the Ritz values θ and weights τ² (squared first components of T's
    eigenvectors). Σ_v Σ_i τ²θ^p / n_v estimates tr(H^p)/D."""
    layout = _whole(D, basis.layout)
    nodes = []
    for index in range(n_vectors):
        generator = torch.Generator().manual_seed(seed * 100_003 + index)
        start = signs(generator, D, layout.indices)  # a rank draws only its entries
        result = lanczos(matvec, start.to(basis.device), steps, basis=basis)
        theta, S = torch.linalg.eigh(result.tridiagonal())
        nodes.append((theta, S[0] ** 2))
    return nodes


def slq_density(nodes: list[tuple[torch.Tensor, torch.Tensor]], grid: torch.Tensor, sigma: float) -> torch.Tensor:
    """Spectral density on ``grid``: Gaussians of width ``sigma`` at the Ritz values, weighted by
    τ² and averaged over starting vectors (integrates to 1)."""
    density = torch.zeros_like(grid, dtype=torch.float64)
    for theta, weights in nodes:
        z = (grid[:, None] - theta[None, :]) / sigma
        density += (weights[None, :] * torch.exp(-0.5 * z**2)).sum(1) / (sigma * math.sqrt(2 * math.pi))
    return density / len(nodes)


def conjugate_gradient(
    matvec: MatVec,
    b: torch.Tensor,
    damping: float = 0.0,
    *,
    rtol: float = 1e-8,
    max_iterations: int = 1000,
    layout: Layout | None = None,
) -> tuple[torch.Tensor, int, float]:
    """Solve (H + λI)x = b by conjugate gradients (H + λI must be positive definite on the
    Krylov space); stops when ‖b − (H + λI)x‖ ≤ rtol·‖b‖. Returns (x, iterations, relative residual);
    with a sharded ``layout``, b and x are this rank's parts."""
    layout = _whole(b.size(-1), layout)

    def dot(u: torch.Tensor, v: torch.Tensor) -> float:
        return float(layout.dots(u.unsqueeze(0), v.unsqueeze(0))[0])

    b = b.to(torch.float64)
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = dot(r, r)
    norm_b = math.sqrt(dot(b, b)) or 1.0
    for iteration in range(1, max_iterations + 1):
        Ap = matvec(p.unsqueeze(0))[0] + damping * p
        curvature = dot(p, Ap)
        if curvature <= 0:
            raise ValueError(
                f"H + {damping}·I is not positive definite along a CG direction "
                f"(pᵀ(H + λI)p = {curvature:.3g}); increase the damping"
            )
        step = rr / curvature
        x += step * p
        r -= step * Ap
        rr_new = dot(r, r)
        if math.sqrt(rr_new) <= rtol * norm_b:
            return x, iteration, math.sqrt(rr_new) / norm_b
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, max_iterations, math.sqrt(rr) / norm_b


def tensor_blocks(flat: FlatParameters) -> list[tuple[str, slice]]:
    """One block per parameter tensor."""
    blocks, start = [], 0
    for name, size in zip(flat.names, flat.sizes, strict=True):
        blocks.append((name, slice(start, start + size)))
        start += size
    return blocks


def layer_blocks(flat: FlatParameters) -> list[tuple[str, list[slice]]]:
    """One block per transformer layer (``layers.N.*``); embeddings, final norm and output are one
    block each."""
    groups: dict[str, list[slice]] = {}
    for name, block in tensor_blocks(flat):
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "layers" else parts[0]
        groups.setdefault(key, []).append(block)
    return list(groups.items())


def block_diagonal_error(
    matvec: MatVec, V: torch.Tensor, blocks: list[tuple[str, slice | list[slice]]], layout: Layout | None = None
) -> dict:
    """How wrong the block-diagonal approximation H_bd is along directions V (K, D).

    H_bd v concatenates, for each block b, the block's own HVP restricted to it: (H (P_b v))|_b,
    computed with the exact operator. Returns per-direction ‖Hv − H_bd v‖/‖Hv‖ and cos(Hv, H_bd v).
    Blocks are global slices; with a sharded ``layout`` V is this rank's parts.
    """
    layout = _whole(V.size(1), layout)
    V = V.to(torch.float64)
    masks = []
    for _, block in blocks:
        mask = torch.zeros(layout.D, dtype=torch.bool)
        for piece in block if isinstance(block, list) else [block]:
            mask[piece] = True
        masks.append(layout.local(mask).to(V.device))
    full = matvec(V)
    approx = torch.zeros_like(full)
    for mask in masks:
        approx[:, mask] += matvec(V * mask)[:, mask]
    norms = layout.norms(full)
    error = layout.norms(full - approx) / norms
    cosine = layout.dots(full, approx) / (norms * layout.norms(approx))
    return {"relative_error": error, "cosine": cosine}
