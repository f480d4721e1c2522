"""The comparison of seeds: every pair of runs compared at matched steps (the same seed twice
identical, the controls' pairs as baselines), summarised, written as comparison.csv; records whose
vectors changed are refused."""

import json
import os
import stat

import pytest
from seed_runs import seed_experiment

from tiny_llm.geometry.comparison import compare, write_comparison


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Seeds 1 and 2, seed 1 again (same-seed control), each measured at every checkpoint."""
    return seed_experiment(tmp_path_factory.mktemp("seeds"))


def test_seeds_compared_at_matched_steps_with_controls(experiment, tmp_path):
    path, _, _, _ = experiment
    files = {label: sorted((path / "records" / label).glob("*.json")) for label in ("s1", "s2", "s1-again")}
    rows = compare(files, {"s1-again": "same-seed"})
    value = {(r["step"], r["subject"], r["metric"]): r for r in rows}
    for step in (0, 3, 6):
        twin = value[(step, "s1|s1-again", "gradient_cosine")]
        assert twin["value"] == pytest.approx(1.0, abs=1e-12) and twin["role"] == "same-seed"
        for metric in ("parameter_subspace_overlap", "function_subspace_overlap"):
            assert value[(step, "s1|s1-again", metric)]["value"] == pytest.approx(1.0, abs=1e-12)
        assert value[(step, "s1|s2", "gradient_cosine")]["value"] < 1 - 1e-6
        assert value[(step, "s1|s2", "gradient_cosine")]["role"] == "seed"
        assert value[(step, "s1-again|s2", "gradient_cosine")]["role"] == "other"  # not what the control varies
    assert value[(0, "s1|s2", "function_update_cosine")]["value"] is None  # no earlier checkpoint
    assert value[(3, "s1|s1-again", "function_update_cosine")]["value"] == pytest.approx(1.0, abs=1e-12)
    overlap = value[(6, "s1|s2", "parameter_subspace_overlap")]
    D = json.loads(files["s1"][0].read_text())["dimensions"]["parameters_D"]
    assert overlap["baseline"] == pytest.approx(2 / D) and overlap["kind"] == "pair"
    assert value[(6, "s2", "eval_loss")]["kind"] == "run"
    pairs = [value[(6, subject, "gradient_cosine")]["value"] for subject in ("s1|s2",)]
    assert value[(6, "seed pairs (mean)", "gradient_cosine")]["value"] == pytest.approx(sum(pairs) / len(pairs))
    assert value[(6, "seed pairs (min)", "gradient_cosine")]["kind"] == "summary"
    write_comparison(rows, tmp_path / "comparison.csv")
    assert (tmp_path / "comparison.csv").read_text().splitlines()[
        0
    ] == "step,tokens,subject,kind,role,metric,value,se,baseline"


def test_changed_vectors_are_refused(experiment, tmp_path):
    path, _, _, _ = experiment
    record = path / "records/s2/epoch-001.json"
    umask = os.umask(0)
    os.umask(umask)
    for written in (record, record.with_suffix(".safetensors")):  # readable by the group, as the umask says
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask, written
    copy = tmp_path / "epoch-001.json"
    copy.write_text(record.read_text())
    (tmp_path / "epoch-001.safetensors").write_bytes(b"not the vectors")
    with pytest.raises(ValueError, match="does not match"):
        compare({"s2": [copy]}, {})
