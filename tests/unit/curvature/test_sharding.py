"""What the sharded operator holds on a rank beyond its shards, asked without torch: nothing on one
process; the root's and one block's parameters (and gradients) for a gradient pass; a jet engine's
gathered directions too; a jet pass's activations those of its 1/N of the vocabulary."""

import pytest

from tiny_llm.architectures import parameter_shapes
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.sharding import forms_shape, gathered_parameters, held_unsharded

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
