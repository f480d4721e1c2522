"""The targets of ``rule all``: every figure, and every result of an existing index."""

import json
from pathlib import Path

from workflow_plans import SETTINGS, plan_config

from tiny_llm.campaign.targets import all_targets
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.layout import AUDIT_FIGURES, FIGURES, SPECTRUM_FIGURES


def test_targets_name_every_figure_and_every_indexed_result(workflow_project):
    plan = WorkflowPlan(plan_config(spectrum={"enabled": True}))
    targets = all_targets(plan.campaign, plan.walltimes)
    assert targets[0] == "runs/tiny/trained.json"
    assert {"results/gpu/manifest.json", "results/gpu/summary.csv", "results/gpu/spectrum.csv"} <= set(targets)
    assert all(
        f"results/gpu/figures/{f}.{ext}" in targets
        for f in FIGURES + AUDIT_FIGURES + SPECTRUM_FIGURES
        for ext in ("pdf", "png")
    )
    exact = WorkflowPlan(plan_config(settings={**SETTINGS, "device": "cpu", "dtype": "float64"}))
    exact = all_targets(exact.campaign, exact.walltimes)
    assert "results/gpu/figures/loss.png" in exact and not any("precision_audit" in t for t in exact)  # no audit
    assert not any("/states/" in t for t in targets)  # before the index: the figures pull the results in
    Path("results/gpu").mkdir(parents=True)
    Path("results/gpu/states.json").write_text(json.dumps({"states": [{"key": "a" * 64}, {"key": "b" * 64}]}))
    indexed = WorkflowPlan(plan_config())
    results = [t for t in all_targets(indexed.campaign, indexed.walltimes) if "/states/" in t]
    assert results == [f"results/gpu/states/{k * 64}/{case}.json" for k in "ab" for case in ("seen", "unseen")]
    assert plan.state_results("gpu", "k") == [
        "results/gpu/states/k/seen.json",
        "results/gpu/states/k/unseen.json",
        "results/gpu/spectra/k/seen.json",
        "results/gpu/spectra/k/unseen.json",
    ]
    state = {"aliases": [{"file": "epoch-002.safetensors"}, {"file": "final.pt"}]}
    assert plan.state_checkpoint("gpu", state) == "runs/tiny/epoch-002.safetensors"


def test_a_figure_with_nothing_to_draw_is_not_asked_for_and_the_notes_say_why(workflow_project):
    def figures(settings, **analysis):
        plan = WorkflowPlan(plan_config(settings={**SETTINGS, **settings}, **analysis))
        names = {Path(t).stem for t in all_targets(plan.campaign, plan.walltimes) if "/figures/" in t}
        return names, plan.runs.notes

    everything, notes = figures({})
    assert {"step_sharpness", "step_loss", "preconditioned_batch_sizes", "loss"} <= everything and notes == []
    plain, notes = figures({"trajectory": False, "preconditioned": False})
    assert plain == everything - {"step_sharpness", "step_loss", "preconditioned_batch_sizes"}
    assert notes == ["analyses.gpu: settings.trajectory is false; step_sharpness and step_loss are not drawn"]
    initial, notes = figures({}, checkpoints=["epoch-000.safetensors"], spectrum={"enabled": True})
    assert "preconditioned_batch_sizes" not in initial and "preconditioned_sharpness" not in initial
    assert "top_eigenvalues" in initial and notes == [
        "analyses.gpu: no state it selects has the optimizer's preconditioner (at step 0 Adam has no second moment "
        "yet); its preconditioned figures are not drawn"
    ]
