"""Hugging Face LlamaForCausalLM and GPT2LMHeadModel in and out: logits equal to transformers' in
float64 both ways, tied and untied heads, a bit-identical round trip, and refusals by name."""

import json
from pathlib import Path

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt): these tests never skip
from hf_float64 import float64_transformers

from tiny_llm.config import ModelConfig
from tiny_llm.model.gpt2 import GPT2
from tiny_llm.model.hf import read_hf, write_hf
from tiny_llm.model.llama import Llama

SHAPE = dict(
    vocab_size=40,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=12,
    rms_norm_eps=1e-6,
    rope_theta=500.0,
)


@pytest.fixture(autouse=True)
def float64(monkeypatch):
    float64_transformers(monkeypatch)


def _hf_model(tmp_path, tied, **changes):
    config = transformers.LlamaConfig(**{**SHAPE, **changes}, tie_word_embeddings=tied)
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():  # norms away from 1, so that a swapped norm weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    path = tmp_path / ("tied" if tied else "untied")
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def _tokens():
    return torch.randint(0, SHAPE["vocab_size"], (3, 12), generator=torch.Generator().manual_seed(5))


def _assert_logits_equal(ours, theirs):
    """Equal to 1e-12 relative to the logits' scale (their largest magnitude): an entry near zero
    differs by rounding of the others' size."""
    error = float((ours - theirs).abs().max() / theirs.abs().max())
    assert error < 1e-12, error


def _assert_imported_exactly(path, hf, expected, cls):
    """read_hf of ``path`` gives the ``expected`` config, and our ``cls`` model with its weights gives
    transformers' logits."""
    config, state = read_hf(path)
    assert config == expected
    model = cls(config, attention_backend="reference").double()
    model.load_state_dict(state, strict=True)
    x = _tokens()
    with torch.no_grad():
        _assert_logits_equal(model(x), hf(x).logits)


def _assert_exported_exactly(out, config, model, hf_class):
    """write_hf of ``model``: transformers opens it as ``hf_class`` with our logits, and reading it
    back gives the same config and bit-identical tensors."""
    write_hf(out, config, model.state_dict())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
    assert type(hf).__name__ == hf_class
    x = _tokens()
    with torch.no_grad():
        _assert_logits_equal(hf(x).logits, model(x))
    again, state = read_hf(out)
    assert again == config and state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in model.state_dict().items())


@pytest.mark.parametrize("tied", [True, False])
def test_imported_llama_gives_transformers_logits(tmp_path, tied):
    hf, path = _hf_model(tmp_path, tied)
    _assert_imported_exactly(
        path,
        hf,
        ModelConfig(
            vocab_size=40,
            d_model=16,
            n_layers=2,
            n_heads=4,
            d_ff=24,
            max_seq_len=12,
            rope_theta=500.0,
            norm_eps=1e-6,
            tie_embeddings=tied,
        ),
        Llama,
    )


@pytest.mark.parametrize("tied", [True, False])
def test_exported_llama_gives_our_logits_in_transformers_and_round_trips_exactly(tmp_path, tied):
    config = ModelConfig(
        vocab_size=40,
        d_model=16,
        n_layers=2,
        n_heads=4,
        d_ff=24,
        max_seq_len=12,
        rope_theta=500.0,
        norm_eps=1e-6,
        tie_embeddings=tied,
    )
    torch.manual_seed(4)
    model = Llama(config, attention_backend="reference").double()
    _assert_exported_exactly(tmp_path / "out", config, model, "LlamaForCausalLM")
    with pytest.raises(ValueError, match="exists; choose a new directory"):
        write_hf(tmp_path / "out", config, model.state_dict())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"head_dim": 8}, "head_dim=8 cannot be represented here (need hidden_size / num_attention_heads = 4"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' cannot be represented here"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}},
            "cannot be represented here (RoPE scaling of kind default, linear or llama3 only",
        ),
    ],
)
def test_configurations_our_llama_cannot_represent_are_refused(tmp_path, changes, message):
    _, path = _hf_model(tmp_path, True, **changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_hf(path)


class _Payload:
    """Unpickling this would create a file: proof that a .bin is never run as code."""

    marker: Path = Path("/nonexistent")

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_only_local_directories_are_read(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"meta-llama/Llama-3.2-1B is not a local directory; it looks like a hub id: "
        r"fetch a revision into the local cache \(hf download meta-llama/Llama-3.2-1B --revision REV\)",
    ):
        read_hf("meta-llama/Llama-3.2-1B")
    _, path = _hf_model(tmp_path, True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "opt"}))
    with pytest.raises(ValueError, match="model_type='opt' cannot be represented here"):
        read_hf(path)


@pytest.mark.parametrize("sharded", [False, True])
def test_pickled_bin_weights_are_read_as_tensors_in_their_stored_dtype(tmp_path, sharded):
    """pytorch_model.bin (single, or sharded with its index) gives the same model as safetensors,
    its float16 kept as stored."""
    hf, path = _hf_model(tmp_path, False)
    state = {k: v.half() for k, v in hf.state_dict().items()}
    (path / "model.safetensors").unlink()
    if sharded:
        keys = sorted(state)
        halves = {"pytorch_model-00001-of-00002.bin": keys[::2], "pytorch_model-00002-of-00002.bin": keys[1::2]}
        for file, names in halves.items():
            torch.save({k: state[k] for k in names}, path / file)
        weight_map = {k: file for file, names in halves.items() for k in names}
        (path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        torch.save(state, path / "pytorch_model.bin")
    _, ours = read_hf(path)
    assert {t.dtype for t in ours.values()} == {torch.float16}
    assert len(ours) == len(state) and torch.equal(ours["tok_embeddings.weight"], state["model.embed_tokens.weight"])
    assert torch.equal(ours["layers.1.feed_forward.w2.weight"], state["model.layers.1.mlp.down_proj.weight"])


def test_a_bin_that_would_run_code_is_refused_and_never_run(tmp_path):
    _, path = _hf_model(tmp_path, True)
    (path / "model.safetensors").unlink()
    _Payload.marker = tmp_path / "executed"
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "x": _Payload()}, path / "pytorch_model.bin")
    with pytest.raises(
        ValueError,
        match=r"pytorch_model.bin is a pickle that would run code when read \(it calls .*pathlib.*\), not plain",
    ):
        read_hf(path)
    assert not _Payload.marker.exists()
    (path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ValueError, match="pytorch_model.bin is truncated or corrupt"):
        read_hf(path)
    (path / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match="has no model.safetensors or pytorch_model.bin"):
        read_hf(path)


def test_key_value_heads_and_index_shards_that_cannot_be_are_refused_by_name(tmp_path):
    """Zero key/value heads (once read as none given), a count that does not divide the query heads,
    and a safetensors index whose shard lies outside the checkpoint's folder."""
    _, path = _hf_model(tmp_path, True)
    config = json.loads((path / "config.json").read_text())
    heads = config["num_attention_heads"]
    for value in (0, heads + 1, -1, 1.5):
        (path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": value}))
        with pytest.raises(ValueError, match=rf"num_key_value_heads={value!r} cannot be represented here \(need a "):
            read_hf(path)
    (path / "config.json").write_text(json.dumps(config))
    (tmp_path / "elsewhere.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    (path / "model.safetensors").rename(path / "model-00001-of-00001.safetensors")
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "../elsewhere.safetensors"}}))
    with pytest.raises(ValueError, match=r"weight_map names '../elsewhere.safetensors', not a file of"):
        read_hf(path)


def test_import_and_export_through_the_command_line(tmp_path, capsys):
    """import-hf makes a run directory (its weights a checkpoint the analysis reads), export-hf
    writes it back bit-identically, and training refuses the imported run."""
    from safetensors.torch import load_file

    from tiny_llm.cli import main
    from tiny_llm.config import load_config
    from tiny_llm.model.checkpoint import load_weights

    hf, path = _hf_model(tmp_path, False)
    run = tmp_path / "runs/imported"
    assert (
        main(
            [
                "--quiet",
                "import-hf",
                str(path),
                "--run-dir",
                str(run),
                "--set",
                "data.seq_len=12",
                "--step",
                "300",
                "--tokens",
                "9600",
            ]
        )
        == 0
    )
    config = load_config(run / "resolved.yaml")
    assert config.model.d_model == 16 and config.data.seq_len == 12
    state, metadata = load_weights(run / "epoch-000.safetensors")
    assert metadata["step"] == "300" and metadata["tokens"] == "9600"
    imported = json.loads((run / "imported.json").read_text())["checkpoints"]
    assert [c["checkpoint"] for c in imported] == ["epoch-000.safetensors"] and imported[0]["step"] == 300
    assert imported[0]["files"].keys() >= {"config.json", "model.safetensors"}
    assert (
        main(
            [
                "--quiet",
                "export-hf",
                "--run",
                str(run),
                "--checkpoint",
                "epoch-000.safetensors",
                "--out",
                str(tmp_path / "back"),
            ]
        )
        == 0
    )
    original, back = load_file(path / "model.safetensors"), load_file(tmp_path / "back/model.safetensors")
    assert original.keys() == back.keys() and all(torch.equal(original[k], back[k]) for k in original)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run)]) == 2
    assert "holds imported weights (imported.json); training would overwrite them" in capsys.readouterr().err
    assert main(["import-hf", str(path), "--run-dir", str(run)]) == 2
    assert "holds an import already; import into a new run directory" in capsys.readouterr().err


GPT2_SHAPE = dict(
    vocab_size=40,
    n_embd=16,
    n_inner=40,
    n_layer=2,
    n_head=4,
    n_positions=12,
    layer_norm_epsilon=1e-5,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)
GPT2_CONFIG = dict(architecture="gpt2", vocab_size=40, d_model=16, n_layers=2, n_heads=4, d_ff=40, max_seq_len=12)


def _hf_gpt2(tmp_path, tied, **changes):
    """A random GPT2LMHeadModel, saved; biases and norms random too, so that a misplaced or
    untransposed tensor would show."""
    config = transformers.GPT2Config(**{**GPT2_SHAPE, **changes}, tie_word_embeddings=tied)
    torch.manual_seed(6)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    path = tmp_path / ("gpt2-tied" if tied else "gpt2-untied")
    model.save_pretrained(path, safe_serialization=True)
    return model, path


@pytest.mark.parametrize("tied", [True, False])
def test_imported_gpt2_gives_transformers_logits(tmp_path, tied):
    hf, path = _hf_gpt2(tmp_path, tied)
    _assert_imported_exactly(path, hf, ModelConfig(**GPT2_CONFIG, tie_embeddings=tied), GPT2)


@pytest.mark.parametrize("tied", [True, False])
def test_exported_gpt2_gives_our_logits_in_transformers_and_round_trips_exactly(tmp_path, tied):
    config = ModelConfig(**GPT2_CONFIG, tie_embeddings=tied)
    torch.manual_seed(7)
    model = GPT2(config, attention_backend="reference").double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _assert_exported_exactly(tmp_path / "out", config, model, "GPT2LMHeadModel")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"activation_function": "relu"}, "activation_function='relu' cannot be represented here (need gelu_new"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True cannot be represented here"),
        ({"scale_attn_weights": False}, "scale_attn_weights=False cannot be represented here"),
    ],
)
def test_configurations_our_gpt2_cannot_represent_are_refused(tmp_path, changes, message):
    _, path = _hf_gpt2(tmp_path, True, **changes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        read_hf(path)


def test_a_misshaped_tensor_is_named_as_the_file_names_it(tmp_path):
    """A weight whose shape differs from what config.json gives is refused naming the file's key
    and both shapes, not our internal name."""
    from safetensors.torch import load_file, save_file

    _, path = _hf_model(tmp_path, False)
    state = load_file(path / "model.safetensors")
    state["model.layers.0.mlp.down_proj.weight"] = state["model.layers.0.mlp.down_proj.weight"][:, :-1].contiguous()
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"model.layers.0.mlp.down_proj.weight has shape \[\d+, \d+\], but its config"
    ) as e:
        read_hf(path)
    assert str(path) in str(e.value) and "feed_forward" not in str(e.value)
