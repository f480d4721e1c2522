"""The tiny-llm command line end to end, and the seed document's analysis API against its runs."""

import json

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch.func import functional_call, grad, jvp

from tiny_llm.cli import main
from tiny_llm.config import load_config
from tiny_llm.data.tokens import TokenCache
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama

TINY = [
    "--set",
    "model.d_model=8",
    "--set",
    "model.n_heads=2",
    "--set",
    "model.d_ff=16",
    "--set",
    "model.n_layers=1",
    "--set",
    "model.max_seq_len=16",
    "--set",
    "data.seq_len=16",
    "--set",
    "data.shuffle_group_blocks=4",
    "--set",
    "training.batch_size=4",
    "--set",
    "training.micro_batch_size=4",
    "--set",
    "training.tokens=512",
    "--set",
    "training.epochs=2",
    "--set",
    "training.checkpoint_policy=interval",
]


@pytest.fixture
def trained_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--quiet", "prepare-data", *TINY, "--shard-tokens", "64"]) == 0
    assert main(["--quiet", "train", *TINY, "--run-dir", "runs/baseline"]) == 0
    return tmp_path / "runs" / "baseline"


def test_seed_analysis_api_runs_as_written(trained_run, monkeypatch):
    monkeypatch.chdir(trained_run.parent.parent)
    # --- verbatim from the seed's "Analysis API", with our run's names ---
    config = load_config("runs/baseline/resolved.yaml")
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(load_file("runs/baseline/epoch-002.safetensors"), strict=True)
    inputs = torch.tensor([[1, 4, 8]])
    targets = torch.tensor([[4, 8, 2]])
    loss = token_losses(model(inputs), targets).mean()
    parameters = tuple(model.parameters())
    gradient = torch.autograd.grad(loss, parameters, create_graph=True)
    direction = tuple(torch.randn_like(p) for p in parameters)
    directional_gradient = sum((g * v).sum() for g, v in zip(gradient, direction, strict=True))
    hvp = torch.autograd.grad(directional_gradient, parameters)
    # --- end of the seed's code ---
    assert all(h.dtype == torch.float64 for h in hvp)
    names = [n for n, _ in model.named_parameters()]

    def f(params):
        return token_losses(functional_call(model, dict(zip(names, params, strict=True)), (inputs,)), targets).mean()

    _, expected = jvp(grad(f), (tuple(p.detach() for p in parameters),), (direction,))
    for h, e in zip(hvp, expected, strict=True):
        torch.testing.assert_close(h, e, rtol=0, atol=1e-10)


def test_cache_meta_and_run_contents(trained_run):
    meta = json.loads((trained_run.parent.parent / "cache/demo/meta.json").read_text())
    assert meta["tokenizer"]["type"] == "byte" and len(meta["shards"]) > 1 and meta["source"]["kind"] == "demo"
    resolved = yaml.safe_load((trained_run / "resolved.yaml").read_text())
    assert resolved["training"]["tokens"] == 512 and resolved["model"]["d_model"] == 8
    assert sorted(p.name for p in trained_run.glob("epoch-*")) == [f"epoch-00{i}.safetensors" for i in range(3)]


def test_rerun_resumes_nothing_and_changed_setting_is_refused(trained_run, capsys):
    before = (trained_run / "final.pt").stat().st_mtime_ns
    assert main(["--quiet", "train", "--run-dir", str(trained_run)]) == 0  # resolved.yaml is the config
    assert (trained_run / "final.pt").stat().st_mtime_ns == before
    assert main(["--quiet", "train", "--run-dir", str(trained_run), "--set", "training.seed=5"]) == 2
    assert "other settings (training.seed: 0 -> 5)" in capsys.readouterr().err


def test_unknown_config_key_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("training:\n  learning_rate: 0.1\n")
    assert main(["train", "--config", "run.yaml", "--run-dir", "runs/x"]) == 2
    assert "unknown key training.learning_rate; allowed keys: training.batch_size" in capsys.readouterr().err
    assert main(["prepare-data", "--config", "run.yaml"]) == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]


def test_missing_cache_is_explained(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "--run-dir", "runs/x"]) == 2
    assert "is not a token cache (no meta.json); run `tiny-llm prepare-data` first" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_text_and_token_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = "The quick brown fox jumps over the lazy dog. Ünïcode too.\n" * 40
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    assert (
        main(["--quiet", "prepare-data", *TINY, "--out", "cache/text", "--source", "text", "a.txt", "--keep-order"])
        == 0
    )
    meta = json.loads((tmp_path / "cache/text/meta.json").read_text())
    shard = np.fromfile(tmp_path / "cache/text" / meta["shards"][0]["file"], dtype="<u2")
    assert bytes(shard.astype(np.uint8))[:20] == text.encode()[:20] and meta["order"] == {"shuffled": False}
    assert meta["source"]["files"][0]["bytes"] == len(text.encode())
    assert main(["--quiet", "prepare-data", *TINY, "--out", "cache/shuffled", "--source", "text", "a.txt"]) == 0
    shuffled = TokenCache(tmp_path / "cache/shuffled")
    source, offset = shuffled.block_sources()[0][0]
    assert (
        shuffled.shuffled
        and bytes(shuffled.tokens([0])[0].numpy().astype(np.uint8))
        == (text.encode()[offset : offset + shuffled.seq_len + 1])
    )
    np.save(tmp_path / "ids.npy", np.arange(5000) % 300)
    assert (
        main(
            [
                "--quiet",
                "prepare-data",
                *TINY,
                "--out",
                "cache/ids",
                "--source",
                "tokens",
                "ids.npy",
                "--vocab-size",
                "300",
            ]
        )
        == 0
    )
    meta = json.loads((tmp_path / "cache/ids/meta.json").read_text())
    assert meta["tokenizer"]["type"] == "external" and meta["vocab_size"] == 300
    assert (
        main(["prepare-data", *TINY, "--out", "cache/bad", "--source", "tokens", "ids.npy", "--vocab-size", "256"]) == 2
    )
    assert not (tmp_path / "cache/bad").exists()


def test_errors_are_one_line_and_debug_shows_the_traceback(trained_run, tmp_path, capsys, monkeypatch):
    """Unwritable outputs and bad devices: one line on stderr, exit status 2, nothing written;
    --debug (or TINY_LLM_DEBUG=1) re-raises for a bug report."""
    run = str(trained_run)
    state = [
        "analyze-state",
        "--run",
        run,
        "--checkpoint",
        "epoch-001.safetensors",
        "--case",
        "seen",
        "--device",
        "cpu",
        "--dtype",
        "float64",
        "--noise-samples",
        "1",
        "--random-samples",
        "1",
    ]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.json").mkdir()
    cases = [
        ([*state, "--output", str(tmp_path / "afile" / "out.json")], "afile is a file, not a folder"),
        ([*state, "--output", str(tmp_path / "adir.json")], "adir.json is a directory; give a file path"),
        (["train", *TINY, "--run-dir", str(tmp_path / "afile")], "is a file; choose another path"),
        (["train", *TINY, "--run-dir", str(tmp_path / "new"), "--device", "bogus"], "--device: expected cpu"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(["--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("runs", "cache")) == ["adir.json", "afile"]
    assert list((tmp_path / "adir.json").iterdir()) == []
    with pytest.raises(ValueError, match="--device: expected cpu"):
        main(["--quiet", "--debug", *cases[3][0]])
    monkeypatch.setenv("TINY_LLM_DEBUG", "1")
    with pytest.raises(ValueError, match="--device: expected cpu"):
        main(["--quiet", *cases[3][0]])


def test_analyze_state_along_the_step_to_a_successor(trained_run, tmp_path, capsys):
    """--successor: the statistics along the step to the next checkpoint, as the workflow measures them."""
    argv = ["--quiet", "analyze-state", "--run", str(trained_run), "--checkpoint", "epoch-001.safetensors"]
    argv += ["--case", "seen", "--device", "cpu", "--dtype", "float64", "--random-samples", "1"]
    assert main([*argv, "--output", str(tmp_path / "step.json"), "--successor", "epoch-002.safetensors"]) == 0
    result = json.loads((tmp_path / "step.json").read_text())
    assert result["trajectory"]["successor"] == {"file": "epoch-002.safetensors", "step": 8}  # from its metadata
    step_case = [*argv, "--case", "step", "--output", str(tmp_path / "own.json")]  # the last --case counts
    assert main([*step_case, "--successor", "epoch-002.safetensors"]) == 0  # on the step's own batches
    assert json.loads((tmp_path / "own.json").read_text())["data"]["plan"] == "steps 5..8"
    assert result["statistics"]["actual_loss_change"] < 0 and result["statistics"]["step_norm"] > 0
    assert main([*argv, "--output", str(tmp_path / "alone.json")]) == 0
    assert "step_norm" not in json.loads((tmp_path / "alone.json").read_text())["statistics"]
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "step.json")]) == 2  # measured along another step
    assert "was measured along the step to" in capsys.readouterr().err
