"""A job's one resolution, torch-free: the engines, compilation, micro-batch and TF32 its settings
give on a CUDA device or not, and the memory plan the campaign, the calibration job and the worker
all take from it."""

from dataclasses import replace

import pytest

from tiny_llm.config import ModelConfig, RunConfig
from tiny_llm.workers.resolution import ITEMSIZE, memory_plan, resolve
from tiny_llm.workers.settings import AnalysisSettings

RUN = RunConfig()


@pytest.mark.parametrize(
    "settings, cuda, expected",
    [
        (AnalysisSettings(), False, ("adjoint", False, "double_backward", False, False)),
        (AnalysisSettings(), True, ("adjoint", False, "pearlmutter", True, True)),
        (AnalysisSettings(compile_hvp=False), True, ("adjoint", False, "double_backward", False, True)),
        (AnalysisSettings(directions_per_pass=1), False, ("taylor", False, "double_backward", False, False)),
        (AnalysisSettings(engine="pearlmutter"), True, ("pearlmutter", True, "pearlmutter", True, True)),
        (AnalysisSettings(dtype="float64"), True, ("adjoint", False, "pearlmutter", True, False)),
        (AnalysisSettings(tf32=False), True, ("adjoint", False, "pearlmutter", True, False)),
    ],
)
def test_settings_resolve_for_a_kind_of_device(settings, cuda, expected):
    resolution = resolve(settings, RUN, cuda)
    got = (resolution.engine, resolution.compiled, resolution.hvp_engine, resolution.hvp_compiled, resolution.tf32)
    assert got == expected
    assert resolution.hvp_batch_size == RUN.training.micro_batch_size


def test_a_model_without_second_order_rules_resolves_an_hvp_engine(tmp_path):
    config = replace(RUN, model=ModelConfig(architecture="hf", hf_config=str(tmp_path / "config.json")))
    assert resolve(AnalysisSettings(hvp_batch_size=4), config, cuda=False).engine == "double_backward"
    assert resolve(AnalysisSettings(hvp_batch_size=4), config, cuda=False).hvp_batch_size == 4


def test_the_memory_plan_is_that_of_the_resolution():
    """The forms pass runs the resolved engine on the resolved micro-batch, in the dtype's bytes;
    a sharded plan is one rank's; an unsharded job ignores the ranks."""
    settings = AnalysisSettings(hvp_batch_size=8, directions_per_pass=4, audit=False)
    plan = memory_plan(settings, RUN, budget_bytes=None, cuda=False)
    forms = next(p for p in plan.passes if p.name == "forms")
    assert forms.rows == 8 and plan.shards == 1
    wide = memory_plan(replace(settings, dtype="float64"), RUN, budget_bytes=None, cuda=False)
    assert ITEMSIZE == {"float64": 8, "float32": 4} and wide.peak_bytes > plan.peak_bytes
    assert memory_plan(settings, RUN, None, cuda=False, ranks=4).shards == 1
    assert memory_plan(replace(settings, sharded=True), RUN, None, cuda=False, ranks=4).shards == 4
