"""The measurement plan: the counts a (state, case) job runs and the planner prices, and the
direction groups it lists, which the job measures exactly."""

import pytest
import torch
from builders import make_oracle_run

from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.measurement import MeasurementPlan
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.llama import Llama


def test_the_plan_counts_every_direction_pass_and_gradient():
    plain = MeasurementPlan.of(10, 4, 3)
    assert (plain.noise_samples, plain.directions, plain.passes(2), plain.passes(16)) == (4, 4 + 1 + 3, 4, 1)
    assert (plain.gradient_batches, plain.forward_batches) == (14, 0)
    assert MeasurementPlan.of(10, None, 0).noise_samples == 10 and MeasurementPlan.of(3, 8, 0).noise_samples == 3
    full = MeasurementPlan.of(10, 4, 3, consensus=2, blocks=5, step=True)
    # noise, ḡ and Δ, each once more per block; then the random and the consensus directions
    assert full.directions == (4 + 1 + 1) * 6 + 3 + 2
    assert full.forward_batches == 10 and full.passes(16) == 3


def _measured_groups(result: dict) -> list[tuple]:
    """The directions a result measured, read from its records: (kind, geometry, count, per block)."""
    groups = []
    for geometry, part in (("plain", result), ("preconditioned", result["preconditioned"])):
        if part is None:
            continue
        noise, blocks = part["noise_samples"], part["blocks"]
        per_block = noise[0].get("block_noise_curvatures") is not None
        groups += [("noise", geometry, len(noise), False)] + [("noise", geometry, len(noise), True)] * per_block
        groups += [("gradient", geometry, 1, False)]
        groups += [("gradient", geometry, 1, True)] * ("grad_curvature" in blocks[0] and per_block)
        groups += [("random", geometry, len(part["random_directions"]), False)]
    if result["consensus"] is not None:
        groups.append(("consensus", "plain", len(result["consensus"]["workers"]), False))
    if result["trajectory"] is not None:
        groups += [("step", "plain", 1, False)] + [("step", "plain", 1, True)] * (
            "step_curvature" in result["blocks"][0]
        )
    return groups


@pytest.mark.parametrize("job", ["plain", "everything"])
def test_a_job_measures_exactly_the_groups_its_plan_lists(tmp_path, job):
    """The worker runs the plan: every group the plan it records lists (kind × geometry × count ×
    block) is measured, and no other; the audit replays a seeded subset of every geometry's noise and
    random groups and ḡ, as its audit groups say. (Sharded, the plan is one process's:
    test_sharded_noise.py; the price reads the same plan: tests/unit/campaign/test_plan.py.)"""
    run = make_oracle_run(tmp_path, tokens=3 * 6 * 5 * 2)  # 5 batches
    torch.manual_seed(1)
    model = Llama(run.model, attention_backend="reference").double()
    flat = FlatParameters(model)
    generator = torch.Generator().manual_seed(2)
    extras = {}
    if job == "everything":  # two packed workers, a successor's step, a preconditioner, blocks, the audit
        extras = dict(
            consensus=[(w, torch.randn(flat.D, dtype=torch.float64, generator=generator) * 1e-2) for w in range(2)],
            step=torch.randn(flat.D, dtype=torch.float64, generator=generator) * 1e-2,
            preconditioner=10 ** torch.rand(flat.D, dtype=torch.float64, generator=generator),
            block_curvature=True,
            audit=(2, 2),
            workers=2,
        )
    inputs = CaseInputs(
        cache=TokenCache(run.data.cache), plan=epoch_plan(run, 1), micro_batch_size=2, hvp_batch_size=2,
        noise_samples=3, random_samples=4, seed=5, engine="adjoint", directions_per_pass=4, compile=False, **extras,
    )  # fmt: skip
    result = measure_case(model, inputs, Precision(torch.device("cpu"), torch.float64))
    plan = result["measurement_plan"]
    listed = [(g["kind"], g["geometry"], g["count"], g["per_block"]) for g in plan["groups"]]
    assert listed == _measured_groups(result)
    blocks = len(result["blocks"]) if job == "everything" else 0
    assert plan["directions"] == sum(g["count"] * (blocks if g["per_block"] else 1) for g in plan["groups"])
    audited = [(d["kind"], d.get("geometry", "plain")) for d in (result["audit"] or {}).get("directions", [])]
    expected = [(g["kind"], g["geometry"]) for g in plan["audit_groups"] for _ in range(g["count"])]
    assert sorted(audited) == sorted(expected) and len(audited) == plan["audit_directions"]
    if job == "everything":
        assert {g["geometry"] for g in plan["audit_groups"]} == {"plain", "preconditioned"} and len(audited) == 10
