"""Spectra and solves on the curvature operator against the dense Hessian's eigendecomposition."""

import math

import pytest
import torch
from oracles import TINY_MODEL

from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.spectrum import (
    Basis,
    block_diagonal_error,
    conjugate_gradient,
    lanczos,
    layer_blocks,
    slq,
    slq_density,
    tensor_blocks,
    top_eigenpairs,
)
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.fixture(scope="module")
def problem(dense_problem):
    model, tokens, H = dense_problem
    op = EpochHessian(model, tokens, batch_size=4, engine="double_backward", precision=CPU64, directions_per_pass=8)
    return model, tokens, FlatParameters(model), H, op


@pytest.mark.parametrize("which", ["LA", "LM"])
def test_lanczos_top_eigenpairs(problem, which):
    _, _, flat, H, op = problem
    exact, vectors = torch.linalg.eigh(H)
    order = torch.argsort(exact if which == "LA" else exact.abs(), descending=True)[:3]
    values, found, residuals, converged = top_eigenpairs(op.hvp, flat.D, k=3, steps=120, which=which)
    torch.testing.assert_close(values, exact[order], rtol=1e-8, atol=0)
    overlap = (found * vectors[:, order].T).sum(1).abs()  # up to sign
    assert (overlap > 1 - 1e-8).all()
    assert (residuals < 1e-6 * exact.abs().max()).all()
    assert not converged.any()  # no tolerance asked: nothing is claimed
    _, _, short, _ = top_eigenpairs(op.hvp, flat.D, k=3, steps=6, which=which)
    assert short.max() > 1e3 * residuals.max()  # unconverged pairs are reported as such


@pytest.mark.parametrize("which", ["LA", "LM"])
def test_lanczos_stops_when_the_wanted_pairs_converge_and_says_when_they_did_not(problem, which):
    """With a tolerance, Lanczos stops once every wanted pair's residual is within it (well before
    the step cap), agrees with the dense spectrum, and flags each pair; a cap too low is flagged."""
    _, _, flat, H, op = problem
    exact = torch.linalg.eigvalsh(H)
    order = torch.argsort(exact if which == "LA" else exact.abs(), descending=True)[:3]
    calls = []

    def counted(V):
        calls.append(len(V))
        return op.hvp(V)

    values, _, residuals, converged = top_eigenpairs(counted, flat.D, k=3, steps=400, which=which, tolerance=1e-8)
    assert converged.all() and (residuals <= 1e-8 * values.abs()).all()
    torch.testing.assert_close(values, exact[order], rtol=1e-10, atol=0)
    assert len(calls) - 1 < min(400, flat.D)  # stopped on convergence (the last call measures the residuals)
    values, _, residuals, converged = top_eigenpairs(op.hvp, flat.D, k=3, steps=5, which=which, tolerance=1e-8)
    assert not converged.all() and (residuals[~converged] > 1e-8 * values[~converged].abs()).all()


def test_lanczos_basis_is_orthonormal_also_in_bf16(problem):
    _, _, flat, H, op = problem
    start = torch.randn(flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    full = lanczos(op.hvp, start, 40)
    Q = full.basis
    torch.testing.assert_close(Q @ Q.T, torch.eye(len(Q), dtype=torch.float64), atol=1e-10, rtol=0)
    low = lanczos(op.hvp, start, 40, basis=Basis(torch.bfloat16, torch.float32))
    top_full = torch.linalg.eigvalsh(full.tridiagonal())[-1]
    top_low = torch.linalg.eigvalsh(low.tridiagonal())[-1]
    assert abs(top_low - top_full) / abs(top_full) < 1e-2  # bf16 vectors keep the top of the spectrum


def test_slq_moments_and_density(problem):
    """SLQ's moments and density on the epoch Hessian (applied densely: the operator's products are
    the dense Hessian's, tested above; 1,200 of them through the model would take a minute)."""
    _, _, flat, H, op = problem
    D = flat.D
    nodes = slq(lambda V: V @ H, D, n_vectors=40, steps=30, seed=1)
    eig = torch.linalg.eigvalsh(H)
    for p in (1, 2):
        estimate = sum(float((w * t**p).sum()) for t, w in nodes) / len(nodes)
        exact = float((eig**p).sum()) / D
        # Hutchinson-type estimator: standard error of sᵀH^p s / D over 40 vectors
        Hp = torch.linalg.matrix_power(H, p)
        sd = math.sqrt(2 * (float((Hp**2).sum()) - float((Hp.diagonal() ** 2).sum()))) / D
        assert abs(estimate - exact) < 4 * sd / math.sqrt(40) + 1e-12
    grid = torch.linspace(float(eig.min()) - 1, float(eig.max()) + 1, 4001)
    density = slq_density(nodes, grid, sigma=0.05)
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-3)


def test_slq_recovers_a_known_spectrum():
    eig = torch.tensor([-1.0] * 10 + [0.0] * 60 + [2.0] * 30, dtype=torch.float64)
    Q, _ = torch.linalg.qr(torch.randn(100, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    A = Q @ torch.diag(eig) @ Q.T
    nodes = slq(lambda V: V @ A, 100, n_vectors=30, steps=10, seed=2)
    grid = torch.linspace(-3, 4, 7001)
    density = slq_density(nodes, grid, sigma=0.1)
    mass = [
        float(torch.trapezoid(density[(grid > a) & (grid < b)], grid[(grid > a) & (grid < b)]))
        for a, b in ((-1.5, -0.5), (-0.5, 0.5), (1.5, 2.5))
    ]
    assert mass == pytest.approx([0.1, 0.6, 0.3], abs=0.05)


def test_conjugate_gradient_matches_solve(problem):
    _, _, flat, H, op = problem
    damping = float(torch.linalg.eigvalsh(H).abs().max())  # makes H + λI positive definite
    b = torch.randn(flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    x, iterations, residual = conjugate_gradient(op.hvp, b, damping, rtol=1e-10)
    expected = torch.linalg.solve(H + damping * torch.eye(flat.D, dtype=torch.float64), b)
    torch.testing.assert_close(x, expected, rtol=1e-8, atol=1e-10)
    assert residual <= 1e-10 and iterations < flat.D
    with pytest.raises(ValueError, match="not positive definite"):
        conjugate_gradient(op.hvp, b, -2 * damping)


def test_block_diagonal_error_against_the_explicit_blocks(problem):
    _, _, flat, H, op = problem
    V = torch.randn(3, flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    for blocks in (tensor_blocks(flat), layer_blocks(flat)):
        H_bd = torch.zeros_like(H)
        for _, block in blocks:
            idx = torch.cat([torch.arange(s.start, s.stop) for s in (block if isinstance(block, list) else [block])])
            H_bd[idx[:, None], idx[None, :]] = H[idx[:, None], idx[None, :]]
        full, approx = V @ H, V @ H_bd
        result = block_diagonal_error(op.hvp, V, blocks)
        torch.testing.assert_close(
            result["relative_error"], (full - approx).norm(dim=1) / full.norm(dim=1), atol=1e-10, rtol=0
        )
        torch.testing.assert_close(
            result["cosine"], (full * approx).sum(1) / (full.norm(dim=1) * approx.norm(dim=1)), atol=1e-10, rtol=0
        )
        assert (result["relative_error"] > 1e-3).all()  # the blocks really miss cross-block coupling
    assert [name for name, _ in layer_blocks(flat)] == ["tok_embeddings", "layers.0", "layers.1", "norm"]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-8), (torch.float32, 3e-4)])
def test_finite_difference_engine_with_fused_attention(problem, dtype, tolerance):
    """Central differences at the default step, through sdpa attention (no second derivatives),
    within the error measured for the defaults (benchmarks/README.md)."""
    model, tokens, flat, H, _ = problem
    fused = Llama(TINY_MODEL, attention_backend="sdpa").to(dtype)
    fused.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
    op = EpochHessian(
        fused, tokens, batch_size=4, engine="finite_difference", precision=Precision(torch.device("cpu"), dtype)
    )
    V = torch.randn(3, flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    exact = V @ H
    error = (op.hvp(V) - exact).norm(dim=1) / exact.norm(dim=1)
    assert (error < tolerance).all(), error
