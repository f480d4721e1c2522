"""Several short states per cluster job: the group components asked per analysis, and the walltime
the cost line states equal to the one Snakemake sums over the group's jobs."""

from types import SimpleNamespace

import pytest
from snakemake.resources import GroupResources, Resources

from tiny_llm.campaign.packing import StatesPerJob, pack_states, state_group
from tiny_llm.campaign.plan import (
    MAX_STATES_PER_JOB,
    finish_minutes,
    group_minutes,
    job_minutes,
    states_per_job,
)


def test_group_components_per_analysis_the_profiles_first():
    asked = []
    packed = StatesPerJob({"other": 2}, ["a", "b"], lambda name: asked.append(name) or 7)
    assert packed.get(state_group("a"), 1) == 7 and asked == ["a"]
    assert packed["other"] == 2 and packed.get("unknown", 1) == 1
    assert dict(packed) == {"other": 2, "analysis-a": 7, "analysis-b": 7}
    profile = StatesPerJob({"analysis": 3}, ["a"], lambda name: pytest.fail("the profile decides"))
    assert profile[state_group("a")] == 3


def test_installed_once_into_the_runs_group_settings():
    workflow = SimpleNamespace(group_settings=SimpleNamespace(group_components={"analysis": 2}), dryrun=False)
    pack_states(workflow, {"a": None}, lambda name: 5)
    installed = workflow.group_settings.group_components
    pack_states(workflow, {"a": None}, lambda name: 9)
    assert workflow.group_settings.group_components is installed and installed["analysis-a"] == 2


@pytest.mark.parametrize("seconds", [5.0, 40.0, 200.0, 1500.0, 4000.0])
def test_short_states_fill_an_hour_long_ones_stay_alone(seconds):
    per_job = states_per_job(3, seconds)
    one = 3 * -(-2 * seconds // 60)
    assert 1 <= per_job <= MAX_STATES_PER_JOB
    assert per_job == 1 or per_job * one <= 60  # an hour of requested work, not more
    assert per_job == MAX_STATES_PER_JOB or (per_job + 1) * one > 60  # nor less
    assert states_per_job(3, seconds, 4) == 4  # a stated number wins
    assert group_minutes(1, 3, seconds) >= job_minutes(3 * seconds) - 1  # one state: the old walltime
    assert group_minutes(per_job, 3, seconds) >= per_job * 3 * 2 * seconds / 60  # ≥ 2 × the work


def _job(**resources):
    return SimpleNamespace(resources=resources, is_pipe=False, pipe_group=None, is_service=False, is_group=bool)


@pytest.mark.parametrize(("states", "cases", "seconds"), [(1, 2, 100.0), (5, 3, 20.0), (12, 2, 7.0)])
def test_the_stated_walltime_is_snakemakes_sum_over_the_group(states, cases, seconds):
    """The group of a cluster job as the profile makes it (state_slot: 1, local): its cases and
    finish jobs run one after another, so Snakemake's runtime is what :func:`group_minutes` says."""
    analyze = -(-2 * seconds // 60)
    finish = finish_minutes(cases, seconds, states)
    layers = [
        [_job(runtime=int(analyze), gpu=1, state_slot=1, mem_mb=8000, _cores=1, _nodes=1)] * (states * cases),
        [_job(runtime=finish, state_slot=1, mem_mb=8000, _cores=1, _nodes=1)] * states,
    ]
    merged = GroupResources.basic_layered(layers, Resources.from_mapping({"state_slot": 1, "gpu": 4}), run_local=False)
    assert merged["runtime"] == group_minutes(states, cases, seconds)
    assert merged["mem_mb"] == 8000 and merged["gpu"] == 1  # one state at a time: nothing summed


def test_a_dry_run_lists_one_group_per_state():
    workflow = SimpleNamespace(group_settings=SimpleNamespace(group_components={}), dryrun=True)
    pack_states(workflow, {"a": None}, lambda name: 5)
    assert workflow.group_settings.group_components == {}
