"""Seen, unseen and recent on a suite's published training order: a tiny GPT-NeoX trained by a loop
that reads its batches from an indexed dataset (sequence i at step i // B + 1), its revisions in a
local Hugging Face cache, imported as downloaded; the loss each case reports at each checkpoint
equals, in float64, that checkpoint's loss on the sequences of the case's window as this test
computes them from the order itself."""

import json
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
import transformers

from tiny_llm.campaign.orders import plan_order
from tiny_llm.cli import main
from tiny_llm.config import load_config
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.state import analyze_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, ordered_suite

B, T, STEPS, VOCAB = 2, 9, 10, 64
"""2 sequences of 9 tokens (seq_len 8) per step, 10 steps in the order."""
SAVED = (2, 4, 6)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    return root, ordered_suite(root, B, STEPS, SAVED)


@pytest.fixture(scope="module")
def imported(suite, tmp_path_factory):
    root, _ = suite
    project = tmp_path_factory.mktemp("project")
    (project / "run.yaml").write_text(RUN_YAML)
    patch = pytest.MonkeyPatch()
    patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root / "hf"))
    argv = ["--quiet", "import-hf", "org/ordered", "--revision", *(f"step{s}" for s in SAVED)]
    assert main([*argv, "--run-dir", str(project / "runs/suite"), "--config", str(project / "run.yaml")]) == 0
    patch.undo()
    return project / "runs/suite"


def _loss(folder: Path, rows: np.ndarray) -> float:
    """The mean next-token loss of transformers' own model of ``folder`` on ``rows``, in float64
    (its float32 shortcuts swapped for float64, the loss taken here from its float64 logits)."""
    model = transformers.GPTNeoXForCausalLM.from_pretrained(folder, attn_implementation="eager").double().eval()
    tokens = torch.from_numpy(rows.astype(np.int64))
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)))


def test_each_case_reads_its_window_of_the_training_order(suite, imported, tmp_path, monkeypatch):
    from hf_float64 import float64_transformers

    float64_transformers(monkeypatch)
    root, sequences = suite
    run = load_config(imported / "resolved.yaml")
    entry = {"training_order": {"path": str(root / "document"), "sequences_per_step": B}, "case_steps": 2}
    assert plan_order("analyses.a", entry, ["seen"], list(SAVED), run).batch_sequences == 1  # the default: 4 batches
    entry["batch_sequences"] = B  # the training steps' own batches
    plan = plan_order("analyses.a", entry, ["seen", "unseen", "recent"], list(SAVED), run)
    assert [plan.window(c, 4) for c in ("seen", "unseen", "recent")] == [(1, 2), (7, 8), (3, 4)]
    settings = AnalysisSettings(device="cpu", dtype="float64", noise_samples=2, random_samples=1, audit=False)
    for index, step in enumerate(SAVED):
        for case in ("seen", "unseen", "recent"):
            first, last = plan.window(case, step)
            result = analyze_state(
                imported,
                [f"epoch-{index:03d}.safetensors"],
                case,
                settings,
                tmp_path / f"{step}-{case}.json",
                order=plan.job(case, step),
            )
            rows = sequences[(first - 1) * B : last * B]
            expected = _loss(root / f"saved-step{step}", rows)
            assert abs(result["statistics"]["loss"] - expected) < 1e-12 * abs(expected), (step, case)
            assert result["data"]["window"] == {"first_step": first, "last_step": last, "steps": 2}
            assert result["data"]["tokens"] == 2 * B * (T - 1)
            assert sorted(r["positions"] for r in result["noise_samples"]) == [
                [[i] for i in range((first - 1 + b) * B, (first + b) * B)] for b in range(2)
            ]


def test_windows_a_checkpoint_has_not_reached_are_refused(suite, imported, tmp_path):
    root, _ = suite
    run = load_config(imported / "resolved.yaml")
    entry = {"training_order": {"path": str(root / "document"), "sequences_per_step": B}, "case_steps": 3}
    with pytest.raises(ValueError, match=r"analyses.a.cases: case seen: the earliest analysed checkpoint \(step 2\)"):
        plan_order("analyses.a", entry, ["seen"], list(SAVED), run)
    with pytest.raises(ValueError, match=r"case unseen reads steps 7..11, but the training order holds 10 steps"):
        plan_order("analyses.a", {**entry, "case_steps": 5}, ["unseen"], list(SAVED), run)
    settings = AnalysisSettings(device="cpu", dtype="float64", noise_samples=1, random_samples=1, audit=False)
    wrong = {"spec": {"path": str(root / "document"), "sequences_per_step": B}, "window": [3, 4]}
    with pytest.raises(ValueError, match=r"case seen: window steps 3..4 reach past this checkpoint \(step 2\)"):
        analyze_state(imported, ["epoch-000.safetensors"], "seen", settings, tmp_path / "x.json", order=wrong)
    with pytest.raises(ValueError, match=r"case unseen: window steps 3..4 start at or before this checkpoint's step 4"):
        analyze_state(imported, ["epoch-001.safetensors"], "unseen", settings, tmp_path / "x.json", order=wrong)
    assert not (tmp_path / "x.json").exists()
    record = json.loads((imported / "imported.json").read_text())
    assert [c["step"] for c in record["checkpoints"]] == list(SAVED)


def test_a_finished_result_of_another_window_is_refused_not_reused(suite, imported, tmp_path):
    """One identity for the analysis; the window is the result's own (``data.plan``): a result of the
    same state and case over other steps (the analysed checkpoints changed) is refused."""
    root, _ = suite
    settings = AnalysisSettings(device="cpu", dtype="float64", noise_samples=1, random_samples=1, audit=False)
    spec = {"path": str(root / "document"), "sequences_per_step": B}
    output = tmp_path / "seen.json"
    analyze_state(imported, ["epoch-002.safetensors"], "seen", settings, output, order={"spec": spec, "window": [1, 2]})
    before = output.read_bytes()
    again = analyze_state(
        imported, ["epoch-002.safetensors"], "seen", settings, output, order={"spec": spec, "window": [1, 2]}
    )
    assert again["data"]["plan"] == f"steps 1..2 in batches of {B}" and output.read_bytes() == before  # reused
    with pytest.raises(ValueError, match=r"holds the case's batches steps 1..2 in batches of 2, not steps 3..4"):
        analyze_state(
            imported, ["epoch-002.safetensors"], "seen", settings, output, order={"spec": spec, "window": [3, 4]}
        )
    assert output.read_bytes() == before


def test_a_spectrum_on_a_training_order_case_is_that_of_its_window(suite, imported, tmp_path):
    """The top eigenvalue of a recent case equals the dense float64 Hessian's over the sequences of
    its window, read from the order by this test; the window is the result's own (``plan``)."""
    from oracles import dense_epoch_hessian
    from safetensors.torch import load_file

    from tiny_llm.architectures import build_model
    from tiny_llm.workers.spectrum import SpectrumSettings, analyze_spectrum

    root, sequences = suite
    run = load_config(imported / "resolved.yaml")
    entry = {"training_order": {"path": str(root / "document"), "sequences_per_step": B}, "case_steps": 2}
    plan = plan_order("analyses.a", entry, ["recent"], list(SAVED), run)
    settings = AnalysisSettings(device="cpu", dtype="float64", noise_samples=1, random_samples=1, audit=False)
    spectrum = SpectrumSettings(top_k=1, lanczos_steps=80, slq_vectors=1, slq_steps=4, block_samples=1)
    output = tmp_path / "spectrum.json"
    result = analyze_spectrum(
        imported, ["epoch-001.safetensors"], "recent", settings, spectrum, output, order=plan.job("recent", 4)
    )
    model = build_model(run.model, attention_backend="reference").double()
    model.load_state_dict({k: v.double() for k, v in load_file(imported / "epoch-001.safetensors").items()})
    tokens = torch.from_numpy(sequences[2 * B : 4 * B].astype(np.int64))  # steps 3..4, up to step 4
    top = float(torch.linalg.eigvalsh(dense_epoch_hessian(model, tokens))[-1])
    assert result["top_eigenvalues"][0]["eigenvalue"] == pytest.approx(top, rel=1e-8)
    assert result["plan"] == "steps 3..4 in batches of 1"
    with pytest.raises(ValueError, match=r"holds the case's batches steps 3..4 in batches of 1, not steps 1..2"):
        analyze_spectrum(
            imported, ["epoch-001.safetensors"], "recent", settings, spectrum, output, order=plan.job("seen", 4)
        )


def test_the_step_case_of_a_suite_is_the_steps_from_a_checkpoint_to_the_next(suite, imported, tmp_path):
    """step at step 4 (next analysed: 6) reads steps 5..6 of the order, the last checkpoint the
    case_steps after it; ΔᵀHΔ and ḡᵀΔ on them equal the dense float64 oracle's."""
    from oracles import dense_epoch_hessian
    from safetensors.torch import load_file

    from tiny_llm.architectures import build_model
    from tiny_llm.curvature.hessian import FlatParameters

    root, sequences = suite
    run = load_config(imported / "resolved.yaml")
    entry = {"training_order": {"path": str(root / "document"), "sequences_per_step": B}, "case_steps": 2}
    plan = plan_order("analyses.a", entry, ["step"], list(SAVED), run)
    assert [plan.window("step", s, n) for s, n in ((2, 4), (4, 6), (6, None))] == [(3, 4), (5, 6), (7, 8)]
    assert plan.window("step", 2, 3) == (3, 3)  # a step shorter than case_steps: all of it
    settings = AnalysisSettings(device="cpu", dtype="float64", noise_samples=1, random_samples=1, audit=False)
    successor = {"key": "next", "file": "epoch-002.safetensors", "step": 6}
    result = analyze_state(
        imported,
        ["epoch-001.safetensors"],
        "step",
        settings,
        tmp_path / "step.json",
        order=plan.job("step", 4, 6),
        successor=successor,
    )
    assert result["data"]["window"] == {"first_step": 5, "last_step": 6, "steps": 2}
    theta, following = (load_file(imported / f"epoch-00{e}.safetensors") for e in (1, 2))
    model = build_model(run.model, attention_backend="reference").double()
    model.load_state_dict({k: v.double() for k, v in theta.items()})
    flat = FlatParameters(model)
    tokens = torch.from_numpy(sequences[4 * B : 6 * B].astype(np.int64))  # steps 5..6
    H = dense_epoch_hessian(model, tokens)
    delta = flat.flatten_state({k: following[k].double() - theta[k].double() for k in theta})
    assert result["statistics"]["step_curvature"] == pytest.approx(float(delta @ H @ delta), rel=1e-8)
    with pytest.raises(ValueError, match=r"case step: window steps 3..4 start at or before this checkpoint's step 4"):
        analyze_state(
            imported, ["epoch-001.safetensors"], "step", settings, tmp_path / "x.json", order=plan.job("step", 2, 4)
        )
