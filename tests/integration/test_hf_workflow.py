"""The workflow on models trained elsewhere: two saved checkpoints of a tiny GPT-NeoX (Pythia's
architecture, neither Llama nor GPT-2) that the test creates with transformers, listed with their
steps in an analysis (hf_checkpoints), imported by the workflow and analysed on the offset case of
a cache prepared with a tokenizer the test trains, with an HVP engine; results, summary.csv with
the given steps, figures; a rerun does nothing."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt)
import yaml

from tiny_llm.cli import main
from tiny_llm.data.corpus import demo_corpus

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def _tokenizer(path, text):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator([text], trainer=trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def test_imported_checkpoints_of_a_third_architecture_through_the_workflow(tmp_path):
    text = bytes(demo_corpus(40_000, seed=4)).decode()
    (tmp_path / "corpus.txt").write_text(text)
    vocab = _tokenizer(tmp_path / "tokenizer", text)
    config = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=16, max_position_embeddings=16, rotary_pct=0.5,
                                        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config)
    for step in (100, 200):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        model.save_pretrained(tmp_path / f"pythia-step{step}", safe_serialization=True)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"cache": "cache/corpus", "seq_len": 12, "shuffle_group_blocks": 4},
        "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 4 * 12 * 3, "epochs": 1}}))
    os.chdir(tmp_path)
    assert main(["--quiet", "prepare-data", "--config", "run.yaml", "--source", "text", "--tokenizer", "tokenizer",
                 "corpus.txt"]) == 0
    settings = {"device": "cpu", "dtype": "float64", "engine": "double_backward", "noise_samples": 2,
                "random_samples": 2, "directions_per_pass": 2, "data_offset": 2}
    checkpoints = [{"path": "pythia-step100", "step": 100, "tokens": 4800},
                   {"path": "pythia-step200", "step": 200, "tokens": 9600}]
    spectrum = {"enabled": True, "top_k": 1, "lanczos_steps": 4, "slq_vectors": 1, "slq_steps": 3, "block_samples": 1,
                "cg_max_iterations": 3}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"analyses": {"pythia": {
        "hf_checkpoints": checkpoints, "config": "run.yaml", "settings": settings, "spectrum": spectrum}}}))
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    done = subprocess.run([str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                           "--configfile", str(tmp_path / "config.yaml"), "-c2"], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = tmp_path / "results/pythia"
    rows = list(csv.DictReader((results / "summary.csv").open()))
    assert sorted((r["case"], int(r["step"])) for r in rows) == [("offset", 100), ("offset", 200)]
    assert all(float(r["noise_curvature"]) != 0 and r["noise_gauss_newton"] == "" for r in rows)
    result = json.loads(next(results.glob("states/*/offset.json")).read_text())
    assert result["data"]["plan"] == "offset-2" and result["precision"]["engine"] == "double_backward"
    assert result["data"]["tokenizer"]["type"] == "huggingface"
    # The command line's numbers for that state (same settings; other thread counts sum in another order).
    alias = result["state"]["aliases"][0]["file"]
    assert main(["--quiet", "analyze-state", "--run", "runs/pythia", "--checkpoint", alias, "--case", "offset",
                 "--output", str(tmp_path / "direct.json"), "--device", "cpu", "--dtype", "float64", "--engine",
                 "double_backward", "--noise-samples", "2", "--random-samples", "2", "--directions-per-pass", "2",
                 "--data-offset", "2"]) == 0
    direct = json.loads((tmp_path / "direct.json").read_text())["statistics"]
    assert direct.keys() == result["statistics"].keys()
    assert all(v == pytest.approx(result["statistics"][k], rel=1e-9) for k, v in direct.items() if v is not None)
    assert json.loads((tmp_path / "runs/pythia/imported.json").read_text())["architecture"] == "hf"
    again = subprocess.run([str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                            "--configfile", str(tmp_path / "config.yaml"), "-c2", "-n"], capture_output=True,
                           text=True, env=env, cwd=REPO)
    assert "Nothing to be done" in again.stdout + again.stderr, (again.stdout + again.stderr)[-3000:]
    spectra = list(csv.DictReader((results / "spectrum.csv").open()))
    assert sorted(int(r["step"]) for r in spectra) == [100, 200] and all(r["case"] == "offset" for r in spectra)
    # float32 with its precision audit, whose float64 reference uses an HVP engine here
    assert main(["--quiet", "analyze-state", "--run", "runs/pythia", "--checkpoint", alias, "--case", "offset",
                 "--output", str(tmp_path / "audited.json"), "--device", "cpu", "--dtype", "float32",
                 "--noise-samples", "2", "--random-samples", "2", "--directions-per-pass", "2"]) == 0
    audit = json.loads((tmp_path / "audited.json").read_text())["audit"]
    assert "double_backward-engine forms" in audit["reference"] and audit["max_statistic_relative_error"] < 1e-3
    figures = sorted(p.name for p in (results / "figures").glob("*.png"))
    assert {"loss.png", "noise_alignment.png", "batch_sizes.png"} <= set(figures), figures
