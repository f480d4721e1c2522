"""Hugging Face causal LMs through the adapter: a tiny GPT-NeoX (Pythia's architecture, read natively
too) that the test creates and saves, imported with ``--adapter`` as a run directory; logits equal to
transformers' own loading of the directory, every HVP engine against the dense Hessian, the
quadratic-form engines refused by name, and the export back."""

import json

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt): these tests never skip
from hf_float64 import float64_transformers
from oracles import PRODUCT_ENGINES
from torch.func import functional_call

from tiny_llm.architectures import build_model
from tiny_llm.cli import main
from tiny_llm.config import load_config
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.model.adapter import HFCausalLM
from tiny_llm.model.causal import check_jet_rules, token_losses
from tiny_llm.model.checkpoint import load_weights

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.fixture(autouse=True)
def float64(monkeypatch):
    """transformers' float32 shortcuts (RoPE, the eager softmax) would round the loss at float32
    resolution and make the dense Hessian and the products differ by percents (hf_float64)."""
    float64_transformers(monkeypatch)


NEOX = dict(
    vocab_size=24,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
    rotary_pct=0.5,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Two saved checkpoints of a random GPT-NeoX in float64, imported into one run directory."""
    path = tmp_path_factory.mktemp("neox")
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**NEOX)).double().eval()
    model.save_pretrained(path / "step-100", safe_serialization=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(path / "step-200", safe_serialization=True)
    (path / "run.yaml").write_text(
        "data: {cache: cache/x, seq_len: 8}\ntraining: {batch_size: 2, micro_batch_size: 2, tokens: 64, epochs: 2}\n"
    )
    assert (
        main(
            [
                "--quiet",
                "import-hf",
                str(path / "step-100"),
                str(path / "step-200"),
                "--run-dir",
                str(path / "runs/neox"),
                "--config",
                str(path / "run.yaml"),
                "--step",
                "100",
                "200",
                "--tokens",
                "1600",
                "3200",
                "--adapter",
            ]
        )
        == 0
    )
    return path


def _adapter(path, checkpoint):
    config = load_config(path / "runs/neox/resolved.yaml")
    model = build_model(config.model).double()
    state, metadata = load_weights(path / "runs/neox" / checkpoint)
    model.load_state_dict(state)
    return model, metadata


def test_imported_weights_give_transformers_logits_and_the_steps_are_recorded(imported):
    config = load_config(imported / "runs/neox/resolved.yaml")
    assert config.model.architecture == "hf" and config.model.hf_config == str(imported / "runs/neox/hf-config.json")
    assert (config.model.d_model, config.model.n_layers, config.model.vocab_size) == (8, 2, 24)
    x = torch.randint(0, 24, (3, 10), generator=torch.Generator().manual_seed(1))
    for checkpoint, source, step in (
        ("epoch-000.safetensors", "step-100", 100),
        ("epoch-001.safetensors", "step-200", 200),
    ):
        ours, metadata = _adapter(imported, checkpoint)
        assert isinstance(ours, HFCausalLM) and int(metadata["step"]) == step
        theirs = transformers.AutoModelForCausalLM.from_pretrained(imported / source, dtype=torch.float64).eval()
        with torch.no_grad():
            a, b = ours(x), theirs(x).logits
            assert float((a - b).abs().max() / b.abs().max()) < 1e-12
    record = json.loads((imported / "runs/neox/imported.json").read_text())
    assert [c["step"] for c in record["checkpoints"]] == [100, 200] and record["architecture"] == "hf"


def _epoch_products(model, tokens, V):
    """V H for the token-mean loss of the whole epoch at once, by reverse mode twice
    (torch.autograd.functional.hvp, one product per row of V).

    Not torch.func's Hessian, as for our own models: through transformers' GPT-NeoX its vmapped
    forward-over-reverse gives a wrong Hessian (vᵀHv −0.0838 where reverse-over-reverse, every
    engine here and second differences of the loss converging as ε² all give −0.0892, measured)."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def loss(x):
        return token_losses(functional_call(model, flat.unflatten(x), (tokens[:, :-1],)), tokens[:, 1:]).mean()

    return torch.stack([torch.autograd.functional.hvp(loss, theta, v)[1] for v in V])


@pytest.mark.parametrize("engine", PRODUCT_ENGINES)
def test_every_hvp_engine_equals_autograds_epoch_products(imported, engine):
    """Through the adapter: products and forms of the epoch Hessian against autograd's own product of
    the whole epoch's loss, float64, uneven micro-batches (finite differences within their own
    truncation error)."""
    model, _ = _adapter(imported, "epoch-001.safetensors")
    tokens = torch.randint(0, 24, (5, 7), generator=torch.Generator().manual_seed(2))
    op = EpochHessian(model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=2)
    V = torch.randn(3, op.flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    expected = _epoch_products(model, tokens, V)
    tolerance = 1e-6 if engine == "finite_difference" else 1e-10
    torch.testing.assert_close(op.hvp(V), expected, rtol=0, atol=tolerance * float(expected.abs().max()))
    torch.testing.assert_close(op.quadratic_forms(V), (expected * V).sum(1), rtol=tolerance, atol=0)


def test_quadratic_form_engines_refuse_it_by_name(imported, tmp_path):
    model, _ = _adapter(imported, "epoch-000.safetensors")
    with pytest.raises(ValueError, match="only this project's own architectures"):
        check_jet_rules(model)
    with pytest.raises(ValueError, match="only this project's own architectures"):
        EpochHessian(
            model.double(), torch.zeros(2, 5, dtype=torch.long), batch_size=2, engine="adjoint", precision=CPU64
        )
    out = tmp_path / "back"
    assert (
        main(
            [
                "--quiet",
                "export-hf",
                "--run",
                str(imported / "runs/neox"),
                "--checkpoint",
                "epoch-001.safetensors",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
    original = transformers.AutoModelForCausalLM.from_pretrained(imported / "step-200", dtype=torch.float64).eval()
    assert all(
        torch.equal(a, b) for a, b in zip(again.state_dict().values(), original.state_dict().values(), strict=True)
    )


def test_the_step_is_read_from_a_trainers_state_when_not_given(imported, tmp_path):
    (imported / "step-200/trainer_state.json").write_text(json.dumps({"global_step": 200, "epoch": 1.0}))
    assert (
        main(
            [
                "--quiet",
                "import-hf",
                str(imported / "step-200"),
                "--run-dir",
                str(tmp_path / "run"),
                "--config",
                str(imported / "run.yaml"),
            ]
        )
        == 0
    )
    assert load_weights(tmp_path / "run/epoch-000.safetensors")[1]["step"] == "200"
    (imported / "step-200/trainer_state.json").unlink()
