"""The precision audit's seeded choices and its two sides: the audited positions are a fixed
function of the seed, distinct and sorted; a float64 model audited against its own float64 copy
finds no error (both sides compute the same numbers), and the float64 side's forms engine is the
exact one."""

import torch
from oracles import TINY_MODEL

from tiny_llm.curvature.audit import audit_choice, audit_sides
from tiny_llm.curvature.case import CaseInputs
from tiny_llm.curvature.hessian import Precision
from tiny_llm.curvature.job import open_job
from tiny_llm.curvature.placement import place
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


def test_audit_choices_are_seeded_distinct_and_sorted():
    chosen = audit_choice(20, 5, seed=3, stream_index=1)
    assert chosen == audit_choice(20, 5, 3, 1) == sorted(set(chosen)) and len(chosen) == 5 and max(chosen) < 20
    assert audit_choice(20, 5, 3, 2) != chosen and audit_choice(0, 5, 3, 1) == [] and len(audit_choice(3, 5, 3, 1)) == 3


def test_a_float64_model_against_its_float64_copy():
    torch.manual_seed(0)
    model = Llama(TINY_MODEL, attention_backend="reference").double()
    batches = list(torch.randint(0, 16, (3, 2, 7), generator=torch.Generator().manual_seed(1)))
    inputs = CaseInputs(
        cache=None, plan=None, micro_batch_size=2, hvp_batch_size=2, noise_samples=2, random_samples=1,
        seed=0, engine="double_backward", directions_per_pass=2, compile=False, audit=(1, 2),
    )  # fmt: skip
    production, exact = audit_sides(open_job(model, batches, inputs.job_cuts(), CPU64, place(model)), inputs)
    assert exact.engine(2) == "adjoint" and exact.engine(1) == "taylor" and production.engine(2) == "double_backward"
    g, loss = production.mean_gradient()
    g64, loss64 = exact.mean_gradient()
    assert torch.equal(g, g64) and loss == loss64
    V = torch.stack([g, exact.vectors.rademacher(0)])
    forms = production.forms(V, torch.cat(batches))
    assert max(abs(a - b) for a, b in zip(forms, exact.forms(V, torch.cat(batches)), strict=True)) < 1e-12
