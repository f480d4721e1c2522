"""One micro-batch's loss and gradient: the head in token chunks gives the same sums, the forward
alone the same loss, and an optimizer batch cut as training cuts it the gradient of its mean loss."""

import pytest
import torch
from oracles import TINY_MODEL

from tiny_llm.model import micro_batch
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Llama(TINY_MODEL, attention_backend="reference").double()


def _gradient(model, *args):
    model.zero_grad(set_to_none=True)
    loss = micro_batch.gradient(model, *args)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return loss, grads


@pytest.mark.parametrize("head_tokens", [None, 1, 5, 1000])
def test_head_chunks_and_the_forward_alone_give_the_same_loss_and_gradient(model, head_tokens):
    tokens = torch.randint(0, TINY_MODEL.vocab_size, (3, 7), generator=torch.Generator().manual_seed(1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    whole_loss, whole = _gradient(model, x, y, 40)
    loss, grads = _gradient(model, x, y, 40, None, head_tokens)
    with torch.no_grad():
        assert float(loss) == pytest.approx(float(token_losses(model(x), y).sum() / 40), rel=1e-13)
    assert float(loss) == pytest.approx(float(whole_loss), rel=1e-13) and torch.allclose(grads, whole, rtol=1e-12)
    forward = micro_batch.loss(model, x, y, 40, None, head_tokens)
    assert forward.dtype == torch.float64 and float(forward) == pytest.approx(float(loss), rel=1e-13)


def test_a_batch_cut_as_training_cuts_it_gives_the_gradient_of_its_mean_loss(model):
    tokens = torch.randint(0, TINY_MODEL.vocab_size, (5, 7), generator=torch.Generator().manual_seed(2))
    assert [len(x) for x, _ in micro_batch.cut(tokens, 2)] == [2, 2, 1]
    model.zero_grad(set_to_none=True)
    loss = micro_batch.accumulate_batch_gradient(model, tokens, 2)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    mean = token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()
    expected = torch.autograd.grad(mean, list(model.parameters()))
    assert float(loss) == pytest.approx(float(mean.detach()), rel=1e-13)
    assert torch.allclose(grads, torch.cat([g.reshape(-1) for g in expected]), rtol=1e-11, atol=1e-14)
    kept = micro_batch.accumulate_batch_gradient(model, tokens, 2, share=lambda micro: micro[:1])
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert float(kept) == pytest.approx(float(token_losses(model(tokens[:2, :-1]), tokens[:2, 1:]).sum() / 30))


def test_training_and_the_analysis_share_the_micro_batch_gradient_and_curvature_imports_no_training():
    from pathlib import Path

    source = Path(micro_batch.__file__).parents[1]
    for path in (source / "curvature").glob("*.py"):
        assert "tiny_llm.training" not in path.read_text(), path.name
    from tiny_llm.training.loop import accumulate_batch_gradient

    assert accumulate_batch_gradient is micro_batch.accumulate_batch_gradient
