"""The integrity gate of a suite trained elsewhere: a suite whose revisions were damaged as
published suites have been (the final weights under an earlier step's name, two steps serving one
checkpoint, a late revision filed early and an early one late) shows each defect, per checkpoint,
before any measurement; the clean suite passes silently."""

import json
import sys
from pathlib import Path

import huggingface_hub
import pytest

from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.cli import main
from tiny_llm.model.integrity import (
    identical_findings,
    init_findings,
    path_findings,
    refuse_identical,
    weights_digest,
)
from tiny_llm.results.drawing import figure_context
from tiny_llm.results.manifest import integrity_block, integrity_flag

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, cache_revision, neox_suite

STEPS = (0, 1, 2, 4, 8, 16, 32, 64)
DAMAGED = {0: 0, 1: 1, 2: 64, 4: 2, 8: 8, 16: 32, 32: 32, 64: 2}
"""Revision step -> the step whose weights it serves."""
EXPECTED = {
    "step2": ["spike"],
    "step4": ["identical", "final"],
    "step16": ["identical"],
    "step32": ["identical"],
    "step64": ["identical", "collapse"],
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    folders = neox_suite(root / "saved", STEPS)  # ‖θ − θ₀‖ grows with the step
    for step in STEPS:
        cache_revision(root / "hf", "org/clean", f"step{step}", folders[step])
        cache_revision(root / "hf", "org/damaged", f"step{step}", folders[DAMAGED[step]])
        other = neox_suite(root / "other", (0,), seed=1)[0] if step == 0 else folders[step]  # another seed's
        cache_revision(root / "hf", "org/reseeded", f"step{step}", other)
    return root / "hf", folders


@pytest.fixture
def project(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub[0]))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    (tmp_path / "a.txt").write_text("a reference text " * 500)
    return tmp_path


def test_the_rules_on_their_own():
    labels = ["a", "b", "c", "d"]
    assert identical_findings(labels, [0, 1, 2, 3], ["x", "y", "z", "w"]) == {}
    found = identical_findings(labels, [0, 1, 2, 3], ["x", "w", "z", "w"])
    assert [f["kind"] for f in found["b"]] == ["identical", "final"] and [f["kind"] for f in found["d"]] == [
        "identical"
    ]
    assert identical_findings(["a", "b"], [5, 5], ["x", "x"]) == {}  # one step under two names: not a defect
    assert path_findings(labels, [0.0, 1.0, 2.0, 4.0]) == {}
    assert [f["kind"] for f in path_findings(labels, [0.0, 9.0, 2.0, 4.0])["b"]] == ["spike"]
    assert list(path_findings([*labels, "e"], [0.0, 1.0, 4.0, 5.0, 1.5])) == ["e"]  # below half of 5
    assert list(path_findings(labels, [0.0, 1.0, 4.0, 1.5])) == ["c"]  # a spike, and no collapse after it
    assert init_findings(labels, [0, 1, 2, 3], 3.0, 1.0) == {} and init_findings(labels, [1, 2, 3, 4], 9.0, 1.0) == {}
    assert [f["kind"] for f in init_findings(labels, [0, 1, 2, 3], 5.0, 1.0)["a"]] == ["init"]
    assert init_findings(labels, [0, 1000, 1001, 1002], 5.0, 1.0) == {}  # per step: 1000 steps moved 5
    with pytest.raises(
        ValueError, match=r"k: checkpoints of different steps hold identical weights \(b, d\): .* set s"
    ):
        refuse_identical(found, "k", "s")


def test_a_cached_revision_is_digested_by_its_blob_names_and_a_folder_by_its_content(hub):
    """In the cache one digest per distinct weight file, whatever revision serves it; a folder's
    digest is its content's."""
    cache, folders = hub
    same = [weights_digest(p) for p in (cache / "models--org--damaged" / "snapshots").iterdir()]
    assert len(set(same)) == len(set(DAMAGED.values()))  # one digest per distinct weight file
    assert weights_digest(folders[4]) == weights_digest(folders[4]) != weights_digest(folders[8])


def test_a_damaged_suite_is_refused_at_start_up_naming_its_revisions_and_a_clean_one_plans(project):
    def config(repo, **extra):
        entry = {"config": "run.yaml", "hf_checkpoints": {"repo": repo}, "tokens_per_step": 16, **extra}
        return {"analyses": {"p": {**entry, "cache_inputs": ["a.txt"], "cases": ["offset"]}}}

    assert WorkflowPlan(config("org/clean")).runs.integrity["p"] == {}
    with pytest.raises(
        ValueError,
        match=r"analyses.p.hf_checkpoints: checkpoints of different steps hold identical weights "
        r"\(step4, step16, step32, step64\).*set analyses.p.allow_identical_states: true",
    ):
        WorkflowPlan(config("org/damaged"))
    found = WorkflowPlan(config("org/damaged", allow_identical_states=True)).runs.integrity["p"]
    assert {label: [f["kind"] for f in fs] for label, fs in found.items()} == {
        "step4": ["identical", "final"],
        "step16": ["identical"],
        "step32": ["identical"],
        "step64": ["identical"],
    }


def test_the_import_reports_every_defect_per_checkpoint(project, capsys):
    revisions = [f"step{s}" for s in STEPS]
    argv = ["--quiet", "import-hf", "org/damaged", "--revision", *revisions, "--config", "run.yaml"]
    assert main([*argv, "--run-dir", "runs/damaged"]) == 2
    assert "checkpoints of different steps hold identical weights" in capsys.readouterr().err
    assert not Path("runs/damaged").exists()
    assert main([*argv, "--run-dir", "runs/damaged", "--allow-identical-states"]) == 0
    record = json.loads(Path("runs/damaged/imported.json").read_text())
    found = {c["revision"]: [f["kind"] for f in c["integrity"]] for c in record["checkpoints"] if c["integrity"]}
    assert found == EXPECTED
    block = integrity_block("runs/damaged")
    assert block["checked"] == 8 and [f["source"] for f in block["flagged"]] == list(EXPECTED)
    assert block["distance_from_first"]["epoch-002.safetensors"] > block["distance_from_first"]["epoch-001.safetensors"]
    flag = integrity_flag(block)
    assert "5 of 8 checkpoints flagged" in flag and "step2 (step 2): ‖θ − θ₀‖" in flag
    Path("runs/clean").parent.mkdir(exist_ok=True)
    clean = ["--quiet", "import-hf", "org/clean", "--revision", *revisions, "--config", "run.yaml"]
    assert main([*clean, "--run-dir", "runs/clean"]) == 0
    assert integrity_block("runs/clean")["flagged"] == []
    reseeded = ["--quiet", "import-hf", "org/reseeded", "--revision", *revisions, "--config", "run.yaml"]
    assert main([*reseeded, "--run-dir", "runs/reseeded"]) == 0  # a step 0 of another seed: reported
    assert [(f["source"], [k["kind"] for k in f["findings"]]) for f in integrity_block("runs/reseeded")["flagged"]] == [
        ("step0", ["init"])
    ]


def test_the_figures_say_which_steps_are_flagged_and_each_case_s_window(tmp_path):
    block = {
        "checked": 3,
        "flagged": [
            {
                "checkpoint": "epoch-001.safetensors",
                "source": "step2",
                "step": 2,
                "findings": [{"kind": "spike", "detail": "..."}],
            }
        ],
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"analysis": "p", "integrity": block}))
    data = {
        "seen": {"window": {"first_step": 1, "last_step": 2, "steps": 2}, "tokens": 4096},
        "recent": {"window": {"first_step": 3, "last_step": 4, "steps": 2}, "tokens": 4096},
        "offset": {"plan": "offset"},
        "step": {"window": {"first_step": 3, "last_step": 4, "steps": 2}, "tokens": 4096},
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"analysis": "p", "integrity": block, "data": data}))
    context = figure_context(tmp_path)
    assert context["integrity_note"] == "suite integrity: steps 2 flagged (spike; manifest.json)"
    # recent's and step's windows are each checkpoint's own: the reference state's (steps 3–4) is not named
    assert context["window_note"] == (
        "seen: steps 1–2 (4,096 tokens); recent: each checkpoint's own last 2 steps; "
        "step: the steps after each checkpoint, up to the next analysed one (per checkpoint)"
    )
