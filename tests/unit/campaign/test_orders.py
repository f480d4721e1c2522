"""An analysis of a suite trained elsewhere on its published training order, planned: each case's
window at each checkpoint's step, the order bound to the output directory, and every window a
checkpoint has not reached (or one beyond the data) refused at start-up. The worker's side:
tests/unit/workers/test_order_cases.py."""

import numpy as np
import pytest

from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.data.training_order import write_megatron


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
        return plan.case_order("p", case, {"aliases": [{"step": step}]}).case

    assert window("seen", 4)["window"] == [1, 2]  # up to the earliest analysed (step 2)
    assert window("unseen", 2)["window"] == [5, 6]  # right after the latest (step 4)
    assert window("recent", 4)["window"] == [3, 4]
    assert window("offset", 4) is None
    assert plan.binding("p")["training_order"]["case_steps"] == 2
    for change, message in (
        ({"case_steps": 3}, r"analyses.p.cases: case seen: the earliest analysed checkpoint \(step 2\) has trained 2"),
        ({"case_steps": 7, "cases": ["unseen"]}, r"case unseen reads steps 5..11, but the training order holds 10"),
        ({"training_order": {**order, "path": "nowhere"}}, r"analyses.p.training_order: .*nowhere.idx does not exist"),
        ({"batch_sequences": 3}, r"analyses.p.batch_sequences: expected a divisor of sequences_per_step \(2\)"),
        ({"spectrum": {"enabled": True}}, "analyses.p.spectrum: spectra of a training order's cases are not measured"),
    ):
        with pytest.raises(ValueError, match=message):
            WorkflowPlan({"analyses": {"p": {**entry, **change}}})
    without = {**entry}
    del without["training_order"]
    with pytest.raises(ValueError, match=r"analyses.p.cases: recent, seen, unseen need the batches training took"):
        WorkflowPlan({"analyses": {"p": without}})
