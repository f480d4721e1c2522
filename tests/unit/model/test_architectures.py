"""Every architecture of the registry, whatever it is: its jet rules give the second derivative of
the loss (torch.func jvp of jvp), and every exact engine gives its dense epoch Hessian. A new
architecture registered in ``tiny_llm.model.architectures.ARCHITECTURES`` is tested here as it is
added."""

import pytest
import torch
from oracles import EXACT_ENGINES, EXACT_PRODUCT_ENGINES, check_whole_model_jet, dense_epoch_hessian

from tiny_llm.config import ModelConfig
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.model.architectures import ARCHITECTURES, build_model
from tiny_llm.model.causal import CausalLM, check_jet_rules

CPU64 = Precision(torch.device("cpu"), torch.float64)


def _model(architecture: str) -> CausalLM:
    torch.manual_seed(3)
    config = ModelConfig(
        architecture=architecture, vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8
    )
    return build_model(config, attention_backend="reference").double()


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_every_architecture_has_jet_rules_that_give_the_loss_curvature(architecture):
    model = _model(architecture)
    assert isinstance(model, CausalLM)
    check_jet_rules(model)
    check_whole_model_jet(model)


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_every_architecture_and_engine_give_the_dense_hessian(architecture, engine):
    model = _model(architecture)
    tokens = torch.randint(0, 16, (3, 6), generator=torch.Generator().manual_seed(4))
    H = dense_epoch_hessian(model, tokens)
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    op = EpochHessian(model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=2)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    if engine in EXACT_PRODUCT_ENGINES:
        torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)
