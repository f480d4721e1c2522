"""The quadratic-form engines (taylor, adjoint) through the operator: their forms and Gauss–Newton
parts against the dense float64 Hessian and Jacobian products, with ignored targets, and on CUDA."""

import pytest
import torch
from oracles import FORM_ENGINES, dense_gauss_newton

from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.model.causal import IGNORE_INDEX
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("K", [1, 3, 16])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
def test_quadratic_form_engines_equal_dense_hessian(dense_problem, engine, K, batch_size):
    """vᵀHv without Hv, in float64, to 1e-10 of the explicit Hessian (padded last micro-batch included)."""
    model, tokens, H = dense_problem
    V = torch.randn(20, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K + batch_size))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == -(-20 // K)


@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("K, batch_size", [(1, 7), (3, 3), (16, 10)])
def test_gauss_newton_split_equals_dense_jacobian_product(dense_problem, engine, K, batch_size):
    """Each form's Gauss–Newton part equals vᵀJᵀ∇²ℓJv from the dense Jacobian, the forms stay those
    of the dense Hessian, and G is positive semi-definite while H is not."""
    model, tokens, H = dense_problem
    G = dense_gauss_newton(model, tokens)
    assert torch.linalg.eigvalsh(G).min() > -1e-12 and torch.linalg.eigvalsh(H).min() < -1e-6
    V = torch.randn(20, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    forms, parts = op.split_quadratic_forms(V)
    torch.testing.assert_close(forms, ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    torch.testing.assert_close(parts, ((V @ G) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == -(-20 // K)  # in the passes of the forms, not extra ones
    with pytest.raises(ValueError, match="Gauss–Newton split needs an engine that computes it"):
        EpochHessian(model, tokens, batch_size=3, engine="double_backward", precision=CPU64).split_quadratic_forms(V)


def test_gauss_newton_split_with_ignored_targets(dense_problem):
    model, tokens, _ = dense_problem
    targets = tokens[:, 1:].clone()
    targets[0, 1:3], targets[2, -1] = IGNORE_INDEX, IGNORE_INDEX
    G = dense_gauss_newton(model, tokens, ignored=[(0, 1), (0, 2), (2, 5)])
    op = EpochHessian(model, tokens, batch_size=7, engine="adjoint", precision=CPU64, directions_per_pass=4)
    op.context.n_targets = int((targets != IGNORE_INDEX).sum())
    V = torch.randn(4, G.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    _, parts = op.batch_split_forms(V, tokens[:, :-1], targets)
    torch.testing.assert_close(parts, ((V @ G) * V).sum(1), rtol=0, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("amp", [False, True])
def test_quadratic_form_engines_on_cuda(dense_problem, engine, amp):
    """The jets on the GPU (float32 with TF32 off, and bf16 autocast) against the float64 oracle."""
    model, tokens, H = dense_problem
    cuda = Llama(model.config, attention_backend="reference").cuda()
    cuda.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    exact = ((V @ H) * V).sum(1)
    previous = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    try:
        op = EpochHessian(
            cuda,
            tokens,
            batch_size=3,
            engine=engine,
            directions_per_pass=4,
            precision=Precision(torch.device("cuda"), torch.float32, amp=amp),
        )
        forms = op.quadratic_forms(V.float()).cpu()
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous
    bound = (1e-2 if amp else 1e-5) * float(exact.pow(2).mean().sqrt())
    assert float((forms - exact).abs().max()) < bound
