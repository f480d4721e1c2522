"""Model: attention backends agree, HVPs equal the explicit Hessian, forward-over-reverse works."""

import pytest
import torch
from torch.func import functional_call, grad, hessian, jvp

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import IGNORE_INDEX, count_parameters, token_losses
from tiny_llm.model.llama import Llama


def _batch(config, B=3, T=7, pad=2):
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, config.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, config.vocab_size, (B, T), generator=g)
    targets[-1, -pad:] = IGNORE_INDEX  # padded tail, as analysis pads its last curvature batch
    return inputs, targets


def _flat_loss(model, inputs, targets):
    """Loss as a function of one flat parameter vector (for torch.func.hessian)."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]

    def loss(flat):
        params = {n: t.view(s) for n, t, s in zip(names, flat.split(sizes), shapes, strict=True)}
        losses = token_losses(functional_call(model, params, (inputs,)), targets)
        return losses.sum() / (targets != IGNORE_INDEX).sum()

    return loss


def test_reference_and_sdpa_logits_agree_in_float64(tiny_model_config):
    reference = Llama(tiny_model_config, attention_backend="reference").double()
    sdpa = Llama(tiny_model_config, attention_backend="sdpa").double()
    sdpa.load_state_dict(reference.state_dict(), strict=True)
    inputs, _ = _batch(tiny_model_config)
    assert torch.allclose(reference(inputs), sdpa(inputs), rtol=0, atol=1e-12)


def test_hvp_equals_explicit_hessian(tiny_model_config):
    model = Llama(tiny_model_config, attention_backend="reference").double()
    inputs, targets = _batch(tiny_model_config)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert 1000 <= flat.numel() <= 3000
    H = hessian(_flat_loss(model, inputs, targets))(flat)
    assert torch.allclose(H, H.T, atol=1e-12)
    v = torch.randn_like(flat)

    # The seed document's double-backward recipe.
    loss = token_losses(model(inputs), targets).sum() / (targets != IGNORE_INDEX).sum()
    params = tuple(model.parameters())
    gradient = torch.autograd.grad(loss, params, create_graph=True)
    direction = v.split([p.numel() for p in params])
    directional = sum((g * d.view_as(g)).sum() for g, d in zip(gradient, direction, strict=True))
    hvp = torch.cat([h.flatten() for h in torch.autograd.grad(directional, params)])
    assert torch.allclose(hvp, H @ v, rtol=0, atol=1e-10)
    assert (H @ v).abs().max() > 1e-3  # a non-trivial product


def test_forward_over_reverse_equals_double_backward(tiny_model_config):
    model = Llama(tiny_model_config, attention_backend="reference").double()
    inputs, targets = _batch(tiny_model_config)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    loss = _flat_loss(model, inputs, targets)
    v = torch.randn_like(flat)
    _, pearlmutter = jvp(grad(loss), (flat,), (v,))
    x = flat.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(x), x, create_graph=True)
    (double_backward,) = torch.autograd.grad(g @ v, x)
    assert torch.allclose(pearlmutter, double_backward, rtol=0, atol=1e-10)


def test_token_losses_ignore_padding():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.tensor([[1, 2, IGNORE_INDEX], [0, IGNORE_INDEX, 4]])
    losses = token_losses(logits, targets)
    assert losses.shape == (2, 3) and losses.dtype == torch.float64
    assert losses[0, 2] == 0 and losses[1, 1] == 0
    expected = -torch.log_softmax(logits[0, 0], -1)[1]
    assert torch.allclose(losses[0, 0], expected, atol=1e-15)


def test_amp_keeps_reductions_in_float32(tiny_model_config):
    model = Llama(tiny_model_config, attention_backend="reference")
    inputs, targets = _batch(tiny_model_config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
        losses = token_losses(logits, targets)
    assert logits.dtype == torch.bfloat16 and losses.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_parameter_count_counts_tied_embedding_once(tiny_model_config):
    C, V, F, L = 8, 16, 16, 2
    per_layer = 4 * C * C + 3 * C * F + 2 * C
    tied = Llama(tiny_model_config)
    untied = Llama(ModelConfig(**{**tiny_model_config.__dict__, "tie_embeddings": False}))
    assert count_parameters(tied) == V * C + L * per_layer + C
    assert count_parameters(untied) == count_parameters(tied) + V * C
    assert list(tied.state_dict()) == [n for n, _ in tied.named_parameters()]  # no duplicated tensor


def test_rejects_unknown_backend_and_long_input(tiny_model_config):
    with pytest.raises(ValueError, match="attention_backend: expected 'reference' or 'sdpa'"):
        Llama(tiny_model_config, attention_backend="flash")
    with pytest.raises(ValueError, match="exceeds model.max_seq_len=8"):
        Llama(tiny_model_config)(torch.zeros(1, 9, dtype=torch.long))


def test_forward_mode_over_reverse_without_decompositions(tiny_model_config):
    """Plain torch.autograd.forward_ad through the backward graph: fails if any op (F.silu) lacks a rule."""
    import torch.autograd.forward_ad as fwAD

    model = Llama(tiny_model_config, attention_backend="reference").double()
    inputs, targets = _batch(tiny_model_config)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    loss = _flat_loss(model, inputs, targets)
    v = torch.randn_like(flat)
    x = flat.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(x), x, create_graph=True)
    (expected,) = torch.autograd.grad(g @ v, x)
    with fwAD.dual_level():
        dual = fwAD.make_dual(flat.clone().requires_grad_(True), v)
        (g_dual,) = torch.autograd.grad(loss(dual), dual, create_graph=True)
        tangent = fwAD.unpack_dual(g_dual).tangent
    assert torch.allclose(tangent, expected, rtol=0, atol=1e-10)
