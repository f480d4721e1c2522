"""A study across seeds: the table of each statistic's mean, spread and range over the seeds at
every step and case, and the figure (the planner's side: tests/unit/campaign/test_studies.py)."""

import pandas as pd
import pytest

from tiny_llm.results.seeds import seed_table, write_study


def _summary(losses: dict[int, float], case: str = "seen") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"state_key": f"k{s}", "case": case, "step": s, "tokens": 8 * s, "loss": v, "b_simple": 2.0}
            for s, v in losses.items()
        ]
    )


def test_the_table_holds_mean_spread_and_range_over_the_seeds_per_step():
    table = seed_table({"a": _summary({1: 3.0, 2: 2.0}), "b": _summary({1: 5.0, 2: 2.5}), "c": _summary({2: 3.0})})
    one, two = table.iloc[0], table.iloc[1]
    assert (one["step"], one["seeds"], one["loss_mean"], one["loss_min"], one["loss_max"]) == (1, 2, 4.0, 3.0, 5.0)
    assert one["loss_std"] == pytest.approx(2**0.5) and one["loss_seeds"] == 2
    assert (two["seeds"], two["loss_mean"], two["loss_std"]) == (3, 2.5, 0.5)
    assert pd.isna(seed_table({"a": _summary({1: 3.0})}).iloc[0]["loss_std"])  # one seed: no spread


def test_the_study_writes_its_table_and_figure(tmp_path):
    paths = {}
    for name, losses in (("s1", {1: 3.0, 2: 2.0, 1000: 1.0}), ("s2", {1: 3.2, 2: 2.1, 1000: 1.1})):
        paths[name] = tmp_path / f"{name}.csv"
        _summary(losses).to_csv(paths[name], index=False)
    written = write_study("study", paths, tmp_path / "out", ["s1 step1 and s2 step1 are the same weights"])
    assert [p.name for p in written] == ["seeds.csv", "seeds.pdf", "seeds.png"]
    assert len(pd.read_csv(tmp_path / "out/seeds.csv")) == 3
    with pytest.raises(ValueError, match="results/x/summary.csv does not exist: analysis x has not been collected"):
        write_study("study", {"x": "results/x/summary.csv", **paths}, tmp_path / "out", [])
