"""Every architecture of the registry, in each of its variants, whatever it is: its jet rules give
the second derivative of the loss (torch.func jvp of jvp), and every exact engine gives its dense
epoch Hessian. A new architecture registered in ``tiny_llm.architectures.ARCHITECTURES`` is
tested here as it is added (a test fails until ``VARIANTS`` names it)."""

import pytest
import torch
from oracles import (
    EXACT_ENGINES,
    EXACT_PRODUCT_ENGINES,
    FORM_ENGINES,
    PRODUCT_ENGINES,
    check_whole_model_jet,
    dense_epoch_hessian,
)

from tiny_llm.architectures import ARCHITECTURES, architecture, build_model, jet_rules
from tiny_llm.config import ModelConfig, RopeScaling
from tiny_llm.curvature.gradients import batch_gradient
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.model.causal import CausalLM, check_jet_rules

CPU64 = Precision(torch.device("cpu"), torch.float64)


VARIANTS = {
    "llama": dict(architecture="llama"),
    "llama-gqa-biases-llama3": dict(
        architecture="llama",
        n_heads=4,
        n_kv_heads=2,
        attention_bias="all",
        mlp_bias=True,
        tie_embeddings=False,
        rope_scaling=RopeScaling(kind="llama3", factor=4.0, original_max_seq_len=4),
    ),
    "qwen2-style": dict(
        architecture="llama", n_kv_heads=1, attention_bias="qkv", rope_scaling=RopeScaling(kind="linear", factor=2.0)
    ),
    "gpt2": dict(architecture="gpt2"),
    "gpt_neox": dict(architecture="gpt_neox", rotary_pct=0.5, tie_embeddings=False),
    "gpt_neox-sequential": dict(architecture="gpt_neox", parallel_residual=False, attention_bias="none"),
}
"""Each architecture with its options: grouped-query heads, every bias kind, RoPE scaling, partial
rotation, both residual forms."""


def _model(variant: str) -> CausalLM:
    config = ModelConfig(
        **{**dict(vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8), **VARIANTS[variant]}
    )
    torch.manual_seed(3)
    model = build_model(config, attention_backend="reference").double()
    with torch.no_grad():  # biases away from 0 and norms away from 1, so that each enters every term
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_every_registered_architecture_with_second_order_rules_has_variants_here():
    """The adapter (``hf``, no second-order rules) is tested in test_adapter.py."""
    assert {name for name, spec in ARCHITECTURES.items() if spec.jets} == {v["architecture"] for v in VARIANTS.values()}


def test_whether_a_model_has_second_order_rules_is_asked_of_its_architecture(tmp_path):
    """jet_rules answers for a configuration and for a model alike, from the registry; a model of an
    architecture without rules is refused by the jet engines' check, before any work."""
    for name, spec in ARCHITECTURES.items():
        assert architecture(name) is spec and spec.model_class().__name__ in spec.model
    model = _model("gpt2")
    assert jet_rules(model) and jet_rules(model.config)
    adapter_config = ModelConfig(architecture="hf", hf_config=str(tmp_path / "config.json"))
    assert not jet_rules(adapter_config)
    with pytest.raises(ValueError, match="model.architecture: expected one of llama, gpt2, gpt_neox, hf"):
        architecture("mamba")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_hugging_face_format_is_declared_by_its_architecture(variant):
    """The registry names the model types each architecture imports; each format reads a config
    into that architecture, and our model is exported in one of them."""
    from tiny_llm.model.hf_formats import FORMATS, export_format

    declared = {t: name for name, spec in ARCHITECTURES.items() for t in spec.hf_model_types}
    assert set(declared) == set(FORMATS)
    config = _model(variant).config
    assert export_format(config).model_type in architecture(config.architecture).hf_model_types


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_architecture_has_jet_rules_that_give_the_loss_curvature(variant):
    model = _model(variant)
    assert isinstance(model, CausalLM)
    check_jet_rules(model)
    check_whole_model_jet(model)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_every_architecture_and_engine_give_the_dense_hessian(variant, engine):
    model = _model(variant)
    tokens = torch.randint(0, 16, (3, 6), generator=torch.Generator().manual_seed(4))
    H = dense_epoch_hessian(model, tokens)
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    op = EpochHessian(model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=2)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    if engine in EXACT_PRODUCT_ENGINES:
        torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("engine", FORM_ENGINES)
def test_the_head_in_token_chunks_gives_the_same_forms_and_gradients(variant, engine):
    """Chunking the output head and loss (5 target positions at a time: chunks cut through
    sequences, the last one short) sums the same terms: forms, their Gauss–Newton parts and the
    batch gradient equal the unchunked ones to 1e-12."""
    model = _model(variant)
    tokens = torch.randint(0, 16, (3, 7), generator=torch.Generator().manual_seed(4))
    V = torch.randn(3, FlatParameters(model).D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    split = [
        EpochHessian(
            model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=3, head_tokens=chunk
        ).split_quadratic_forms(V)
        for chunk in (None, 5)
    ]
    torch.testing.assert_close(split[1], split[0], rtol=0, atol=1e-12)
    flat = FlatParameters(model)
    gradients = [batch_gradient(model, flat, tokens, 2, CPU64, head_tokens=chunk) for chunk in (None, 5)]
    torch.testing.assert_close(gradients[1], gradients[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("engine", PRODUCT_ENGINES)
def test_products_with_the_head_in_token_chunks_are_the_same(variant, engine):
    """Every product engine takes the head in chunks (5 positions, cutting through sequences) when
    asked, one direction or a batch of them: the exact engines' products equal the unchunked ones to
    1e-12 and finite_difference's to the rounding that its step 2ε amplifies; the model's parameters
    and gradients are what they were before."""
    model = _model(variant)
    tokens = torch.randint(0, 16, (3, 7), generator=torch.Generator().manual_seed(4))
    V = torch.randn(3, FlatParameters(model).D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    before = [p.detach().clone() for p in model.parameters()]
    for K in (1, 3):
        products = [
            EpochHessian(
                model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=K, head_tokens=chunk
            ).hvp(V)
            for chunk in (None, 5)
        ]
        tolerance = 1e-8 if engine == "finite_difference" else 1e-12
        torch.testing.assert_close(products[1], products[0], rtol=0, atol=tolerance * products[0].abs().max().item())
        assert not torch.equal(products[0], torch.zeros_like(products[0]))
    for p, saved in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, saved) and p.grad is None


def test_float32_forms_at_a_real_vocabulary_keep_float32_accuracy():
    """At Pythia's vocabulary (50,304) the loss rule's sums run over millions of terms (128 tokens ×
    V): summed in float64 blocks they keep the float32 forms within 2e-6 of float64 (relative to
    their RMS; measured 1.4e-7 adjoint, 1.9e-7 taylor), where one float32 matrix-vector product
    lost two more digits (3.1e-5 and 1.0e-5)."""
    config = ModelConfig(
        architecture="gpt_neox",
        vocab_size=50304,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        max_seq_len=64,
        rotary_pct=0.5,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    model = build_model(config).float()
    tokens = torch.randint(0, 50304, (2, 65), generator=torch.Generator().manual_seed(1))
    V = torch.randn(4, FlatParameters(model).D, generator=torch.Generator().manual_seed(2))
    V /= V.norm(dim=1, keepdim=True)
    exact = EpochHessian(
        model.double(), tokens, batch_size=2, engine="adjoint", precision=CPU64, directions_per_pass=4
    ).quadratic_forms(V.double())
    model.float()
    CPU32 = Precision(torch.device("cpu"), torch.float32)
    for engine in FORM_ENGINES:
        forms = EpochHessian(
            model, tokens, batch_size=2, engine=engine, precision=CPU32, directions_per_pass=4
        ).quadratic_forms(V)
        assert float((forms - exact).abs().max() / exact.square().mean().sqrt()) < 2e-6, engine
