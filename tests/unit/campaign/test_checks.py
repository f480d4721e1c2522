"""What a workflow configuration must satisfy and the runs it declares: seed experiments expanded
into runs and imports, profile values typed."""

import re

import pytest

from tiny_llm.campaign.checks import expand_seed_experiments, expand_seed_imports, typed_profile_values
from tiny_llm.campaign.workflow import WorkflowPlan


def test_seed_experiments_expand_to_seed_and_control_runs(workflow_project):
    runs, roles = expand_seed_experiments(
        {"exp": {"config": "run.yaml", "seeds": [3, 5], "set": {"training.lr": 0.01}}}, {}, {}
    )
    assert roles == {
        "exp": {
            "exp-seed-3": "seed",
            "exp-seed-5": "seed",
            "exp-same-seed": "same-seed",
            "exp-data-order": "data-order",
        }
    }
    assert runs["exp-seed-5"]["set"] == {
        "training.lr": 0.01,
        "training.checkpoint_policy": "interval",
        "training.seed": 5,
    }
    assert runs["exp-same-seed"]["set"]["training.seed"] == 3
    assert runs["exp-data-order"]["set"]["data.seed"] == 8  # the run configuration's data seed + 1
    only_seeds, _ = expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2], "controls": []}}, {}, {})
    assert sorted(only_seeds) == ["exp-seed-1", "exp-seed-2"]
    with pytest.raises(ValueError, match="seed_experiments.exp: an analysis has the same name"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2]}}, {}, {"exp": {}})
    with pytest.raises(ValueError, match="seed_experiments.exp trains runs/exp-seed-1, which train_runs also names"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2]}}, {"exp-seed-1": {}}, {})
    with pytest.raises(ValueError, match=r"^seed_experiments.exp.config: data.cache must be cache/<name> .* got "):
        entry = {"config": "run.yaml", "seeds": [1, 2], "set": {"data.cache": "/data/elsewhere"}}
        expand_seed_experiments({"exp": entry}, {}, {})  # named by the experiment, not by a seed's run
    with pytest.raises(ValueError, match=r"seed_experiments.exp.settings: .*top_k"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2], "settings": {"top_k": 0}}}, {}, {})
    with pytest.raises(ValueError, match=r"seed_comparisons.c: \['nope'\] are not seed_experiments"):
        WorkflowPlan({"seed_comparisons": {"c": {"experiments": ["nope"]}}})


def test_seed_experiments_of_models_trained_elsewhere_expand_to_one_import_per_seed():
    """hf_checkpoints (seed -> list): one import per seed into runs/<name>-seed-<seed>, the first
    preparing the shared cache (text by default), no controls; bad entries refused by key."""
    lists = {1: [{"path": "a/step0"}, {"path": "a/step9"}], 2: [{"path": "b/step0"}, {"path": "b/step9"}]}
    entry = {"config": "run.yaml", "hf_checkpoints": lists, "cache_inputs": ["t.txt"], "cache_source": "demo"}
    imports, roles = expand_seed_imports({"poly": {**entry, "controls": ["same-seed", "data-order"]}}, {}, {})
    assert roles == {"poly": {"poly-seed-1": "seed", "poly-seed-2": "seed"}}
    assert imports["poly-seed-1"]["cache_inputs"] == ["t.txt"] and imports["poly-seed-1"]["cache_source"] == "text"
    assert "cache_inputs" not in imports["poly-seed-2"] and imports["poly-seed-2"]["run"] == "runs/poly-seed-2"
    assert imports["poly-seed-2"]["hf_checkpoints"] == lists[2]
    assert expand_seed_experiments({"poly": entry}, {}, {}) == ({}, {})  # nothing to train
    for changes, message in (
        ({"seeds": [1, 2]}, "seeds (trained here) and hf_checkpoints (trained elsewhere) exclude each other"),
        ({"controls": ["same-seed"]}, "seed_experiments.poly.controls: controls are trained here"),
        ({"hf_checkpoints": {1: lists[1]}}, "seed_experiments.poly.hf_checkpoints: expected two or more seeds"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            expand_seed_imports({"poly": {**entry, **changes}}, {}, {})
    with pytest.raises(ValueError, match="seed_experiments.poly: an analysis has the same name"):
        expand_seed_imports({"poly": entry}, {}, {"poly": {}})
    with pytest.raises(ValueError, match="seed_experiments.poly: give seeds"):
        expand_seed_experiments({"poly": {"config": "run.yaml"}}, {}, {})


def test_profile_values_are_typed_before_validation():
    config = {
        "cluster": {"walltime_hours": "12", "walltime": "estimate"},
        "settings_override": {"amp": "True"},
        "analyses": {"a": {"run": "64"}},
    }
    typed_profile_values(config)
    assert config["cluster"] == {"walltime_hours": 12, "walltime": "estimate"}
    assert config["settings_override"] == {"amp": True} and config["analyses"] == {"a": {"run": "64"}}
