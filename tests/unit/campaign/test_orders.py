"""An analysis of a suite trained elsewhere on its published training order, planned: each case's
window at each checkpoint's step, the order bound to the output directory, and every window a
checkpoint has not reached (or one beyond the data) refused at start-up. The worker's side:
tests/unit/workers/test_order_cases.py."""

import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from tiny_llm.campaign.orders import NOISE_BATCHES, default_batch_sequences
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.data.training_order import write_megatron
from tiny_llm.io import atomic_write_json
from tiny_llm.workers.binding import bind_output


def test_a_suite_with_its_training_order_plans_windowed_cases(project, suite_analysis):
    """seen, unseen and recent of an imported suite with its published order: each job's window
    at its checkpoint's step, the order bound to the output directory; refusals at start-up."""
    write_megatron(project / "document", np.zeros((20, 9), dtype=np.uint16))
    order = {"path": str(project / "document"), "sequences_per_step": 2}
    config = suite_analysis({"repo": "org/p", "revisions": {"min_step": 2}})
    entry = config["analyses"]["p"]
    entry.update(training_order=order, case_steps=2, cases=["seen", "unseen", "recent"])
    plan = WorkflowPlan(config)

    def window(case, step):  # of the indexed state at ``step``
        states = [{"key": f"k{s}", "aliases": [{"step": s}]} for s in (2, 4)]
        return plan.case_order(SimpleNamespace(analysis="p", case=case, key=f"k{step}"), states).case

    assert window("seen", 4)["window"] == [1, 2]  # up to the earliest analysed (step 2)
    assert window("unseen", 2)["window"] == [5, 6]  # right after the latest (step 4)
    assert window("recent", 4)["window"] == [3, 4]
    assert window("offset", 4) is None
    assert plan.binding("p")["case_steps"] == 2 and plan.binding("p")["training_order"]["path"] == order["path"]
    assert plan.binding("p")["batch_sequences"] == 1  # by default: 4 noise batches of the window's 4 sequences
    for change, message in (
        ({"case_steps": 3}, r"analyses.p.cases: case seen: the earliest analysed checkpoint \(step 2\) has trained 2"),
        ({"case_steps": 7, "cases": ["unseen"]}, r"case unseen reads steps 5..11, but the training order holds 10"),
        ({"training_order": {**order, "path": "nowhere"}}, r"analyses.p.training_order: .*nowhere.idx does not exist"),
        ({"batch_sequences": 3}, r"analyses.p.batch_sequences: expected a divisor of sequences_per_step \(2\)"),
    ):
        with pytest.raises(ValueError, match=message):
            WorkflowPlan({"analyses": {"p": {**entry, **change}}})
    assert WorkflowPlan({"analyses": {"p": {**entry, "spectrum": {"enabled": True}}}}).spectrum_enabled("p")
    without = {**entry}
    del without["training_order"]
    with pytest.raises(ValueError, match=r"analyses.p.cases: recent, seen, unseen need the batches training took"):
        WorkflowPlan({"analyses": {"p": without}})


def test_the_default_noise_batch_cuts_a_window_into_several_batches():
    """Pythia's one step of 1,024 sequences: 8 noise batches of 128; a window of 8 steps: the
    training batch; a step of 3 sequences: batches of 1; a divisor of the step's batch always."""
    assert NOISE_BATCHES == 8
    assert default_batch_sequences(1024, 1) == 128 and default_batch_sequences(1024, 8) == 1024
    assert default_batch_sequences(1024, 3) == 256  # 12 batches: 384 would not divide 1,024
    assert default_batch_sequences(3, 1) == 1 and default_batch_sequences(2, 2) == 1


def test_a_window_of_one_batch_is_refused_at_start_up(project, suite_analysis):
    """One batch gives no noise estimate: refused, saying what to set, not measured as noise 0."""
    write_megatron(project / "document", np.zeros((20, 9), dtype=np.uint16))
    config = suite_analysis({"repo": "org/p", "revisions": {"min_step": 2}})
    entry = config["analyses"]["p"]
    entry.update(training_order={"path": "document", "sequences_per_step": 2}, cases=["seen"])
    for change in ({"batch_sequences": 2}, {"training_order": {"path": "document", "sequences_per_step": 1}}):
        with pytest.raises(
            ValueError, match=r"analyses.p: a window of 1 step\(s\) of \d sequences in batches of \d+ is a si"
        ):
            WorkflowPlan({"analyses": {"p": {**entry, **change}}})
    assert WorkflowPlan({"analyses": {"p": {**entry, "batch_sequences": 1}}}).orders["p"].batch_sequences == 1


def test_every_setting_of_an_order_is_bound_to_the_results(project, suite_analysis):
    """Changing what an order case measures (window, noise batch, the order's files and layout)
    stops the workflow at start-up once results exist, naming the key as configured."""
    sequences = np.random.default_rng(0).integers(0, 64, size=(20, 9)).astype(np.uint16)
    write_megatron(project / "document", sequences)
    shutil.copyfile(project / "document.bin", project / "other.bin")
    shutil.copyfile(project / "document.idx", project / "other.idx")
    sequences.tofile(project / "tokens.u16")
    np.save(project / "order.npy", np.arange(20))
    config = suite_analysis({"repo": "org/p", "revisions": {"min_step": 2}})
    entry = config["analyses"]["p"]
    order = {"path": "document", "sequences_per_step": 2}
    entry.update(training_order=order, case_steps=2, cases=["seen", "unseen"])
    bind_output("results/p", WorkflowPlan(config).binding("p"))
    atomic_write_json(project / "results/p/states/k/seen.json", {"done": True})
    array = {"path": "tokens.u16", "format": "token_array", "sequence_tokens": 9, "sequences_per_step": 2}
    for change, named in (
        ({"case_steps": 1}, "case_steps: 2 -> 1"),
        ({"batch_sequences": 2}, "batch_sequences: 1 -> 2"),
        ({"training_order": {**order, "path": "other"}}, "training_order.path: 'document' -> 'other'"),
        ({"training_order": {**order, "sequence_tokens": 9}}, "training_order.sequence_tokens: None -> 9"),
        ({"training_order": array}, "training_order.format: 'megatron' -> 'token_array'"),
        ({"training_order": {**array, "order": "order.npy"}}, "training_order.order: None -> 'order.npy'"),
        ({"training_order": {**array, "dtype": "int16"}}, "training_order.dtype: 'uint16' -> 'int16'"),
    ):
        with pytest.raises(
            ValueError, match=r"results/p holds results made with other settings \(.*" + re.escape(named)
        ):
            WorkflowPlan({"analyses": {"p": {**entry, **change}}})
    WorkflowPlan(config)  # unchanged: plans
