"""What the sharded operator holds on a rank beyond its shards, asked without torch: nothing on one
process; the root's and one block's parameters (and gradients) for a gradient pass; a jet engine's
gathered directions too; a jet pass's activations those of its 1/N of the vocabulary."""

import pytest

from tiny_llm.architectures import parameter_shapes
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.memory import GiB, JobShape, plan_analysis
from tiny_llm.curvature.sharding import forms_shape, gathered_parameters, head_chunked, held_unsharded

CONFIG = ModelConfig(architecture="gpt_neox", vocab_size=1000, d_model=64, n_heads=4, d_ff=256, n_layers=3)


def test_the_gathered_parameters_are_the_declared_ones():
    shapes = parameter_shapes(CONFIG)
    assert gathered_parameters(CONFIG) == (shapes.root_count, shapes.block_count, shapes.largest_gathered)
    root, block, largest = gathered_parameters(CONFIG)
    assert largest == 256 * 64  # an MLP projection: the embedding is looked up by rows, never gathered whole
    assert root == 1000 * 64 + 2 * 64  # the embedding and the final norm (tied head)


@pytest.mark.parametrize("engine", ["taylor", "finite_difference"])
def test_what_a_rank_holds_unsharded(engine):
    assert held_unsharded(CONFIG, engine, K=4, shards=1, itemsize=4) == {"gradient": 0, engine: 0}
    root, block, _ = gathered_parameters(CONFIG)
    held = held_unsharded(CONFIG, engine, K=4, shards=2, itemsize=4)
    assert held["gradient"] == 2 * (root + block) * 4
    if engine == "finite_difference":  # gradient passes: nothing more
        assert held[engine] == held["gradient"]
    else:  # the K directions of a block join the parameters
        assert held[engine] > (root + block + 4 * block) * 4


def test_a_sharded_jet_pass_holds_the_activations_of_its_share_of_the_vocabulary():
    assert forms_shape(CONFIG, "taylor", 3).vocab_size == 334
    assert forms_shape(CONFIG, "taylor", 1) == CONFIG
    assert forms_shape(CONFIG, "finite_difference", 3) == CONFIG


def test_a_sharded_gradient_takes_the_head_whole_and_the_plan_prices_it_so():
    assert head_chunked(CONFIG, "gradient", 1) and head_chunked(CONFIG, "finite_difference", 1)
    assert not head_chunked(CONFIG, "gradient", 2) and not head_chunked(CONFIG, "finite_difference", 2)
    assert head_chunked(CONFIG, "taylor", 2)  # the jets' loss runs on each rank's rows of the vocabulary
    assert not head_chunked(ModelConfig(architecture="hf", hf_config="models/x"), "gradient", 1)  # an adapter: no rules
    gpt2 = ModelConfig(architecture="gpt2", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=2)
    job = dict(config=gpt2, seq_len=1024, engine="taylor", K=1, hvp_batch_size=4, micro_batch_size=4, itemsize=4)
    budget = 6 * GiB  # a whole head of 4 × 1024 positions does not fit beside the rest; chunks do
    whole = plan_analysis(JobShape(**job), audit_directions=None, extra_vectors=0, budget_bytes=budget)
    sharded = plan_analysis(JobShape(**job, shards=2), audit_directions=None, extra_vectors=0, budget_bytes=budget)
    assert whole.head_tokens("gradient") is not None and sharded.head_tokens("gradient") is None


def test_the_audit_is_priced_as_it_runs_sharded_and_in_every_geometry():
    """The audit's float64 forms run the engine the audit resolves under the job's placement
    (taylor sharded, adjoint whole for several directions) on the shape that engine's pass holds
    (a sharded jet pass: its share of the vocabulary), with 2a + 1 directions per geometry."""
    gpt2 = ModelConfig(architecture="gpt2", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=2)
    job = dict(config=gpt2, seq_len=1024, engine="taylor", K=4, hvp_batch_size=4, micro_batch_size=4, itemsize=4)
    priced = dict(audit_directions=2, extra_vectors=0, budget_bytes=None)
    whole = plan_analysis(JobShape(**job), **priced)
    sharded = plan_analysis(JobShape(**job, shards=2), **priced)
    both = plan_analysis(JobShape(**job, shards=2), **priced, geometries=2)
    audit = {name: next(p for p in plan.passes if p.name == "audit") for name, plan in
             (("whole", whole), ("sharded", sharded), ("both", both))}  # fmt: skip
    assert (audit["whole"].engine, audit["sharded"].engine, audit["both"].engine) == ("adjoint", "taylor", "taylor")
    assert (audit["sharded"].K, audit["both"].K) == (5, 10)
    assert audit["sharded"].peak_bytes < audit["both"].peak_bytes
