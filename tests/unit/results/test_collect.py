"""Collection: validation before publishing, summary rows per alias and case, blank nulls."""

import copy
import csv
import json

import pytest

from tiny_llm.curvature.statistics import STANDARD_ERRORS, Samples, block_statistics
from tiny_llm.results.collect import BLOCK_COLUMNS, SUMMARY_COLUMNS, collect, validate_result

KEY_A, KEY_B = "a" * 64, "b" * 64


def _result(key, case, identity="id", alignment=0.5):
    noise = [{"noise_curvature": 0.5, "noise_norm": 1.0, "grad_norm": 2.0}]
    return {
        "schema": 1,
        "identity": {"hash": identity},
        "state": {"key": key, "worker_files": None},
        "case": case,
        "statistics": {
            "noise_curvature": 0.5,
            "normalized_alignment": alignment,
            "mean_noise_norm": 1.0,
            "mean_grad_norm": 2.0,
            "full_grad_norm": 1.5,
            "random_curvature": 0.25,
            "grad_curvature": -1.0,
            "b_simple": 4 * 1.0 * (15 / 12) / 2.25,
            "b_noise": None,
            "gradient_sharpness": -1.0 / 2.25,
            "gradient_step": None,
        },
        "standard_errors": {f"{k}_se": None for k in STANDARD_ERRORS},
        "noise_samples": noise,
        "random_directions": [{"curvature": 1.0}],
        "counts": {
            "parameters_D": 4,
            "effective_batch_size": 4,
            "epoch_sequences": 16,
            "micro_batch_size": 2,
            "hvp_batch_size": 2,
            "directions_per_pass": 1,
            "epoch_batches": 4,
            "epoch_tokens": 64,
        },
        "settings": {},
        "precision": {},
        "software": {},
        "hardware": {"host": "x"},
        "slurm": None,
        "data": {"plan": case},
        "consensus": None,
    }


def _tree(tmp_path, results):
    states = {
        "run": "runs/x",
        "packed": False,
        "workers": 1,
        "consensus": False,
        "states": [
            {
                "key": KEY_A,
                "weights_hash": KEY_A,
                "worker_hashes": None,
                "aliases": [{"file": "epoch-001.safetensors", "step": 1, "tokens": 10}],
            },
            {
                "key": KEY_B,
                "weights_hash": KEY_B,
                "worker_hashes": None,
                "aliases": [
                    {"file": "epoch-002.safetensors", "step": 2, "tokens": 20},
                    {"file": "final.pt", "step": 2, "tokens": 20},
                ],
            },
        ],
    }
    for result in results:
        path = tmp_path / "states" / result["state"]["key"] / f"{result['case']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
    return states


def test_summary_has_a_row_per_alias_and_case(tmp_path):
    states = _tree(tmp_path, [_result(k, c) for k in (KEY_A, KEY_B) for c in ("seen", "unseen")])
    manifest = collect(tmp_path, states, ["seen", "unseen"], "demo")
    with open(tmp_path / "summary.csv") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == SUMMARY_COLUMNS
    assert [(r["file"], r["case"]) for r in rows] == [
        ("epoch-001.safetensors", "seen"),
        ("epoch-001.safetensors", "unseen"),
        ("epoch-002.safetensors", "seen"),
        ("epoch-002.safetensors", "unseen"),
        ("final.pt", "seen"),
        ("final.pt", "unseen"),
    ]
    assert rows[0]["b_noise"] == "" and rows[0]["consensus_mean_norm"] == "" and rows[0]["noise_curvature"] == "0.5"
    assert manifest["states"][1]["results"]["unseen"] == f"states/{KEY_B}/unseen.json"
    events = json.loads((tmp_path / "campaign.json").read_text())["events"]
    assert events[-1]["event"] == "collected" and len(events[-1]["jobs"]) == 4
    assert len(manifest["hardware"]) == 1


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop(-1), "unseen.json is missing"),
        (lambda r: r[3]["identity"].update(hash="other"), "was computed with another identity"),
        (lambda r: r[1]["statistics"].update(normalized_alignment=0.7), "normalized_alignment = 0.7 disagrees"),
        (lambda r: r[2]["statistics"].pop("b_simple"), r"statistics \['b_simple'\] are missing"),
        (lambda r: r[0]["standard_errors"].update(random_curvature_se=0.1), "random_curvature_se = 0.1 disagrees"),
        (lambda r: r[0].pop("standard_errors"), "has no standard errors"),
    ],
)
def test_nothing_is_published_from_bad_results(tmp_path, mutate, message):
    results = [_result(k, c) for k in (KEY_A, KEY_B) for c in ("seen", "unseen")]
    mutate(results)
    states = _tree(tmp_path, results)
    with pytest.raises(ValueError, match=message):
        collect(tmp_path, states, ["seen", "unseen"], "demo")
    assert not (tmp_path / "summary.csv").exists() and not (tmp_path / "manifest.json").exists()


def _with_blocks(result):
    """The result with two parameter blocks (the noise sample's ‖v‖² = 1 split 0.25 + 0.75, its
    ‖g‖² = 4 as 1 + 3, ‖ḡ‖² = 2.25 as 0.25 + 2) and their statistics as a job computes them."""
    result["noise_samples"][0] |= {"block_grad_squared_norms": [1.0, 3.0], "block_noise_squared_norms": [0.25, 0.75]}
    samples = Samples.from_result(result)
    result["blocks"] = block_statistics(samples, ["embedding", "layer 0 attention"], [3, 1], [0.25, 2.0])
    return result


def test_blocks_csv_has_a_row_per_alias_case_and_block_and_blocks_are_checked(tmp_path):
    results = [_with_blocks(_result(k, c)) for k in (KEY_A, KEY_B) for c in ("seen", "unseen")]
    states = _tree(tmp_path, results)
    collect(tmp_path, states, ["seen", "unseen"], "demo")
    with open(tmp_path / "blocks.csv") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == BLOCK_COLUMNS and len(rows) == 6 * 2
    first = rows[0]
    assert (first["file"], first["case"], first["block"], first["parameters"]) == (
        "epoch-001.safetensors",
        "seen",
        "embedding",
        "3",
    )
    assert float(first["b_simple"]) == pytest.approx(4 * (15 / 12) * 0.25 / 0.25)
    assert float(first["noise_share"]) == 0.25 and float(rows[1]["gradient_share"]) == pytest.approx(2 / 2.25)
    assert first["b_simple_se"] == ""  # one noise sample
    results[2]["blocks"][1]["b_simple"] = 9.0
    states = _tree(tmp_path, results)
    with pytest.raises(ValueError, match="block layer 0 attention: b_simple = 9.0 disagrees"):
        collect(tmp_path, states, ["seen", "unseen"], "demo")


def test_consensus_is_required_and_checked():
    result = _result(KEY_A, "seen")
    with pytest.raises(ValueError, match="consensus results for workers 0..1 are missing"):
        validate_result(result, KEY_A, "seen", 2, "r.json")
    result["consensus"] = {
        "workers": [
            {"worker": 0, "curvature": 1.0, "squared_norm": 2.0},
            {"worker": 1, "curvature": 3.0, "squared_norm": 2.0},
        ],
        "aggregate": {"mean_curvature": 2.0, "normalized_alignment": 1.0, "mean_norm": 1.4},
    }
    validate_result(result, KEY_A, "seen", 2, "r.json")
    bad = copy.deepcopy(result)
    bad["consensus"]["aggregate"]["mean_curvature"] = 2.5
    with pytest.raises(ValueError, match="consensus aggregates disagree"):
        validate_result(bad, KEY_A, "seen", 2, "r.json")
    with pytest.raises(ValueError, match="expected bbbbbbbbbbbb / seen"):
        validate_result(result, KEY_B, "seen", 2, "r.json")


def test_audit_column_and_threshold_warning(tmp_path, caplog):
    """Collection warns on the statistics' implied errors, not on the worst single form: a form off
    by 5 % whose statistic is right to 0.3 % is no warning, a statistic off by 2 % is, by name."""
    results = [_result(k, c) for k in (KEY_A, KEY_B) for c in ("seen", "unseen")]
    for result, (form, statistic) in zip(
        results, [(1e-5, 1e-5), (1e-3, 2e-2), (None, None), (5e-2, 3e-3)], strict=True
    ):
        result["audit"] = (
            None
            if form is None
            else {
                "max_relative_error": form,
                "directions": [{"relative_error": form}, {"relative_error": form / 2}],
                "max_statistic_relative_error": statistic,
                "statistics_relative_error": {"grad_curvature": statistic, "b_noise": statistic / 3, "b_simple": None},
            }
        )
    states = _tree(tmp_path, results)
    with caplog.at_level("WARNING"):
        manifest = collect(tmp_path, states, ["seen", "unseen"], "demo", audit_threshold=0.01)
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [r["audit_statistic_error"] for r in rows[:4]] == ["1e-05", "0.02", "", "0.003"]
    assert [r["audit_max_relative_error"] for r in rows[:4]] == ["1e-05", "0.001", "", "0.05"]
    assert manifest["audit"] == {
        "threshold": 0.01,
        "audited_rows": 4,
        "max_statistic_error": 0.02,
        "max_relative_error": 0.05,
        "exceeded": [
            {
                "file": "epoch-001.safetensors",
                "case": "unseen",
                "relative_error": 0.02,
                "statistics": ["grad_curvature"],
            }
        ],
    }
    assert (
        "in 1 of 4 audited rows a statistic's implied error exceeds the audit threshold 0.01 (worst 0.02 at "
        "epoch-001.safetensors unseen: grad_curvature)"
    ) in caplog.text
    results[1]["audit"]["max_statistic_relative_error"] = 0.5
    states = _tree(tmp_path, results)
    with pytest.raises(ValueError, match="max_statistic_relative_error disagrees with its statistics"):
        collect(tmp_path, states, ["seen", "unseen"], "demo")
    results[1]["audit"]["max_statistic_relative_error"] = 2e-2
    results[0]["audit"]["max_relative_error"] = 0.5
    states = _tree(tmp_path, results)
    with pytest.raises(ValueError, match="max_relative_error disagrees with its directions"):
        collect(tmp_path, states, ["seen", "unseen"], "demo")
