"""What one (state, case) measurement is given: without a memory plan every pass is whole and the
gradients take training's micro-batch; under one, each pass's groups and head chunks are the plan's."""

from tiny_llm.curvature.case import CaseInputs
from tiny_llm.curvature.memory import MemoryPlan, PassPlan


def _inputs(memory=None) -> CaseInputs:
    return CaseInputs(
        cache=None,
        plan=None,
        micro_batch_size=4,
        hvp_batch_size=8,
        noise_samples=2,
        random_samples=2,
        seed=0,
        engine="adjoint",
        directions_per_pass=3,
        compile=False,
        memory=memory,
    )


def test_a_memory_plan_cuts_the_passes_and_nothing_else():
    whole = _inputs().job_cuts()
    assert whole.curvature() == {} and whole.head_tokens is None and whole.gradient_rows == 4
    passes = (PassPlan("gradient", "gradient", 1, 4, 2, 10, 64), PassPlan("forms", "adjoint", 3, 8, 1, 20))
    planned = _inputs(MemoryPlan(passes=passes, budget_bytes=100)).job_cuts()
    assert planned.gradient_rows == 2 and planned.head_tokens == 64
    assert planned.curvature() == {"group_rows": 1, "head_tokens": None}


def test_the_operators_cuts_are_none_without_a_plan_and_the_plans_under_one():
    assert _inputs().job_cuts().curvature() == {}  # the operator's own defaults
    passes = (PassPlan("gradient", "gradient", 1, 4, 2, 10, 64), PassPlan("forms", "adjoint", 3, 8, 2, 20, 128))
    cuts = _inputs(MemoryPlan(passes=passes, budget_bytes=100)).job_cuts()
    assert cuts.curvature() == {"group_rows": 2, "head_tokens": 128}
    assert (cuts.gradient_rows, cuts.head_tokens) == (2, 64)  # the job's gradients, as the plan cuts them


def test_a_jobs_inputs_take_what_the_settings_say_and_the_rest_as_given():
    from tiny_llm.workers.settings import AnalysisSettings

    settings = AnalysisSettings(noise_samples=3, random_samples=5, seed=7, directions_per_pass=2, block_curvature=True)
    given = dict(cache=None, plan=None, micro_batch_size=4, hvp_batch_size=8, engine="taylor", compile=False)
    inputs = CaseInputs.of(settings, **given, consensus=[], audit=None)
    assert (inputs.noise_samples, inputs.random_samples, inputs.seed) == (3, 5, 7)
    assert inputs.directions_per_pass == 2 and inputs.block_curvature and not inputs.sharded
    assert inputs.engine == "taylor" and inputs.consensus == [] and inputs.audit is None  # given, not the settings'
