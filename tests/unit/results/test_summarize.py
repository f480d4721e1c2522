"""tiny-llm summarize: the table with standard errors, and each flag raised exactly when its
condition holds."""

import csv
import json

from tiny_llm.cli import main
from tiny_llm.results.collect import SUMMARY_COLUMNS
from tiny_llm.results.summarize import summarize


def _analysis(path, rows, manifest=None, spectrum=None):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "summary.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SUMMARY_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    base = {
        "analysis": "mine",
        "run": "runs/mine",
        "cases": ["seen"],
        "states": [{}] * len(rows),
        "precision": {"dtype": "float64", "device": "cpu", "engine": "adjoint"},
        "batch_sizes": {"seen": {"effective_batch_size": 16}},
        "audit": {"threshold": 0.01, "exceeded": []},
        "data_order_warnings": [],
    }
    (path / "manifest.json").write_text(json.dumps({**base, **(manifest or {})}))
    if spectrum:
        with open(path / "spectrum.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(spectrum[0]))
            writer.writeheader()
            writer.writerows(spectrum)
    return path


def _row(file, **values):
    return {
        "file": file,
        "case": "seen",
        "tokens": 1024,
        "loss": 3.25,
        "noise_curvature": 0.5,
        "noise_curvature_se": 0.1,
        "b_noise": 8.0,
        "b_noise_se": 1.0,
        **values,
    }


def test_table_shows_values_with_standard_errors_and_no_flags_when_all_is_well(tmp_path):
    text = summarize(_analysis(tmp_path / "a", [_row("epoch-001.safetensors")]))
    assert "analysis mine: run runs/mine, 1 states × 1 cases; float64 on cpu, engine adjoint" in text
    assert "epoch-001.safetensors" in text and "0.5 ± 0.1" in text and "8 ± 1" in text and "1,024" in text
    assert "B_simple" not in text  # columns without any value are left out
    assert text.endswith("No flags.")


def test_each_flag_is_raised_by_its_condition(tmp_path):
    rows = [
        _row("epoch-000.safetensors", noise_curvature=-0.05, noise_curvature_se=0.1),
        _row("epoch-001.safetensors", b_noise=40.0),
    ]
    manifest = {
        "audit": {
            "threshold": 0.01,
            "exceeded": [
                {"file": "epoch-001.safetensors", "case": "seen", "relative_error": 0.07, "statistics": ["b_noise"]}
            ],
        },
        "data_order_warnings": ["seen: batches are contiguous passages (...)"],
        "precision_floor": {"operations": ["to"], "gradient_rounding": 3.2e-7, "results": 2},
    }
    spectrum = [{"file": "epoch-001.safetensors", "case": "seen", "top_converged_1": "False"}]
    text = summarize(_analysis(tmp_path / "a", rows, manifest, spectrum))
    flags = text.split("Flags:\n")[1].splitlines()
    assert flags[0].startswith(
        "- B_noise exceeds the training batch of 16 in 1 of 2 rows (first: epoch-001.safetensors"
    )
    assert flags[1].startswith(
        "- noise_curvature is within one standard error of 0 in 1 rows (e.g. "
        "epoch-000.safetensors seen): its sign is not known there; raise settings.noise_samples"
    )
    assert flags[2].startswith("- precision audit: in 1 rows a statistic's error exceeds 0.01 (worst 0.07")
    assert flags[3] == (
        "- below float64: the model computes to below float64 in 2 results (its gradients rounded to about "
        "3.2e-07, relative); no statistic is more exact than that"
    )
    assert flags[4].startswith("- top eigenvalues did not converge in 1 rows (e.g. epoch-001.safetensors seen)")
    assert flags[5] == "- data order: seen: batches are contiguous passages (...)"
    assert len(flags) == 6


def test_the_command_prints_it_and_refuses_a_folder_without_an_analysis(tmp_path, capsys):
    folder = _analysis(tmp_path / "a", [_row("final.pt")])
    assert main(["summarize", str(folder)]) == 0
    assert "final.pt" in capsys.readouterr().out
    assert main(["summarize", str(tmp_path / "nothing")]) == 2
    assert "holds no collected analysis (summary.csv and manifest.json)" in capsys.readouterr().err


def test_b_noise_in_the_optimizers_geometry_above_the_batch_is_flagged(tmp_path):
    rows = [
        _row("epoch-000.safetensors", b_noise=4.0),
        _row("epoch-001.safetensors", b_noise=8.0, precond_b_noise=20.0),
    ]
    flags = summarize(_analysis(tmp_path / "a", rows)).split("Flags:\n")[1].splitlines()
    assert flags == [
        "- B_noise,P (in the optimizer's geometry) exceeds the training batch of 16 in 1 of 2 rows (first: "
        "epoch-001.safetensors seen, B_noise,P 20): the critical batch of the optimizer that trained the model "
        "is above the batch it used"
    ]


def test_fewer_noise_batches_than_the_documented_minimum_are_flagged_not_called_exact(tmp_path):
    sizes = {"seen": {"effective_batch_size": 16, "epoch_batches": 4}, "unseen": {"epoch_batches": 8}}
    manifest = {"cases": ["seen", "unseen"], "batch_sizes": sizes}
    flags = summarize(_analysis(tmp_path / "a", [_row("epoch-001.safetensors")], manifest)).split("Flags:\n")[1]
    assert flags.splitlines()[0].startswith(
        "- case seen (4 batches): fewer than 8 noise batches, so the noise statistics (B_simple, B_noise, the noise "
        "forms) are rough estimates even where every batch is used"
    )
    assert "unseen" not in flags  # 8 batches: the documented minimum
    sizes["seen"]["epoch_batches"] = 8
    assert summarize(_analysis(tmp_path / "b", [_row("epoch-001.safetensors")], manifest)).endswith("No flags.")


def test_a_seed_studys_folder_is_summarized_from_its_table(tmp_path):
    import pandas as pd

    from tiny_llm.results.seeds import seed_table

    def seed(losses):
        return pd.DataFrame([{"state_key": f"k{s}", "case": "seen", "step": s, "loss": v} for s, v in losses.items()])

    (tmp_path / "study").mkdir()
    seed_table({"a": seed({1: 3.0, 2: 2.0}), "b": seed({1: 5.0})}).to_csv(tmp_path / "study/seeds.csv", index=False)
    text = summarize(tmp_path / "study")
    assert text.startswith("seed study study: 2 (case, step) rows over up to 2 seeds.")
    lines = text.splitlines()
    assert lines[2].split() == ["case", "step", "seeds", "epoch", "loss", "(nats", "per", "token)"]
    assert lines[4].split() == ["seen", "1", "2", "4", "±", "1.4"] and lines[5].split() == ["seen", "2", "1", "2"]
    assert text.endswith("- 1 rows were measured by one seed only (n = 1): that seed's value, not a mean")
