"""A Trainer suite's optimizer state read end to end: made by transformers' own Trainer (saved and
logged at every step, with weight decay), imported as moments under our names, whose P, bias
correction and logged learning rate reproduce every step the Trainer took between its checkpoints
(so every moment sits on its own parameter); a state grouped otherwise refused, nothing written; a
suite without optimizer states analysed plainly, or refused by name when the geometry is asked for."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tiny_llm.cli import main
from tiny_llm.config import load_config
from tiny_llm.model.checkpoint import load_weights
from tiny_llm.model.moments import load_moments, preconditioner
from tiny_llm.workers.loading import load_state
from tiny_llm.workers.preconditioning import load_preconditioning

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_suites import make_suite, run_config_text

DECAY = 0.1


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])
def stepwise(request, tmp_path_factory):
    """A suite saved and logged at every step, decayed as the Trainer decays: Llama, and GPT-NeoX
    (whose head the module names lm_head and its checkpoints embed_out)."""
    root = tmp_path_factory.mktemp(f"stepwise-{request.param}")
    return make_suite(root, request.param, steps=(1, 2, 3), weight_decay=DECAY)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(run_config_text())
    return tmp_path


def _import(paths, run: str) -> int:
    return main(["--quiet", "import-hf", *map(str, paths), "--run-dir", run, "--config", "run.yaml"])


def test_the_imported_moments_reproduce_every_step_the_trainer_took(stepwise, project):
    assert _import(stepwise, "runs/s") == 0
    run = Path("runs/s")
    record = json.loads((run / "imported.json").read_text())["checkpoints"]
    logged = {
        e["step"]: e["learning_rate"]
        for e in json.loads((stepwise[-1] / "trainer_state.json").read_text())["log_history"]
        if "learning_rate" in e
    }
    for index in (1, 2):  # the step from checkpoint index − 1 to index
        before, after = (load_weights(run / f"epoch-{i:03d}.safetensors")[0] for i in (index - 1, index))
        moments = load_moments(run / f"moments-{index:03d}.safetensors")
        t, lr = moments.step, moments.lr
        assert t == index + 1 and lr == logged[t] and record[index]["optimizer"]["lr"] == lr
        P = preconditioner(moments)
        for name, theta in before.items():
            decay = moments.weight_decay[name]
            assert decay == (0.0 if "norm" in name or name.endswith("bias") else DECAY), name  # the Trainer's rule
            taken = after[name].double() - theta.double()
            expected = -lr * decay * theta.double() - lr * P[name] * moments.exp_avg[name].double() / (
                1 - moments.beta1**t
            )
            assert torch.allclose(taken, expected, rtol=1e-3, atol=1e-6 * lr), name
    # analysed through the run: P at the state, with the step's rate and Adam's threshold
    config = load_config(run / "resolved.yaml")
    state = load_state(run, [run / "epoch-002.safetensors"], config, False)
    found = load_preconditioning(run, state, config, True)
    assert found.record["lr"] == logged[3] and found.record["stability_threshold"] == pytest.approx(
        (2 + 2 * 0.9) / (0.1 * logged[3])
    )


def test_a_state_grouped_otherwise_is_refused_and_nothing_is_written(stepwise, project, capsys):
    copies = []
    for path in stepwise:
        copies.append(project / "in" / path.name)
        shutil.copytree(path, copies[-1])
    state = torch.load(copies[0] / "optimizer.pt", weights_only=True)
    groups = state["param_groups"]
    merged = {**groups[0], "params": groups[0]["params"] + groups[1]["params"]}  # one group: placed by order
    torch.save({**state, "param_groups": [merged]}, copies[0] / "optimizer.pt")
    capsys.readouterr()
    assert _import(copies, "runs/bad") == 2
    err = capsys.readouterr().err
    assert "checkpoint-1/optimizer.pt: parameter groups of" in err and "grouped otherwise" in err
    assert not Path("runs/bad").exists()
    swapped = [{**groups[1], "weight_decay": DECAY}, {**groups[0], "weight_decay": 0.0}]  # decayed last
    torch.save({**state, "param_groups": swapped}, copies[0] / "optimizer.pt")
    assert _import(copies, "runs/bad") == 2 and not Path("runs/bad").exists()


def test_a_suite_without_optimizer_states_is_measured_plainly_or_refused_by_name(stepwise, project):
    copies = []
    for path in stepwise:
        copies.append(project / "in" / path.name)
        shutil.copytree(path, copies[-1], ignore=shutil.ignore_patterns("optimizer.pt"))
    assert _import(copies, "runs/weights-only") == 0
    run = Path("runs/weights-only")
    assert not list(run.glob("moments-*"))
    config = load_config(run / "resolved.yaml")
    state = load_state(run, [run / "epoch-001.safetensors"], config, False)
    blank = load_preconditioning(run, state, config, "auto")
    assert blank.diagonal is None and "publishes its weights only" in blank.record["reason"]
    with pytest.raises(
        ValueError, match="preconditioned: true, but weights-only/epoch-001.safetensors: .*optimizer.pt"
    ):
        load_preconditioning(run, state, config, True)
    assert load_preconditioning(run, state, config, False) is None
