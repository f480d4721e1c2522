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


def test_the_figure_states_n_units_windows_and_a_log_step_axis_for_log_spaced_revisions(tmp_path):
    import json

    import matplotlib.pyplot as plt

    from tiny_llm.results.seeds import study_figure

    paths = {}
    for name, losses in (("s1", {1: 3.0, 2: 2.0, 4: 1.5, 32: 1.0}), ("s2", {1: 3.2, 2: 2.1, 4: 1.6})):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "summary.csv"
        _summary(losses).assign(grad_curvature=1.0).to_csv(paths[name], index=False)
        window = {"seen": {"window": {"first_step": 1, "last_step": 1, "steps": 1}, "tokens": 64}}
        (tmp_path / name / "manifest.json").write_text(json.dumps({"data": window}))
    table = seed_table({name: pd.read_csv(path) for name, path in paths.items()})
    fig = study_figure("study", table, paths, [])
    title = fig._suptitle.get_text()
    assert title.startswith("study: mean over the n = 2 seeds (s1, s2), shaded: their range")
    assert "hollow: 1 points measured by one seed only (n = 1: that seed's value, not a mean)" in title
    assert "windows: seen: steps 1–1 (64 tokens)" in title  # once: the seeds agree
    panels = {ax.get_title(loc="left"): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"epoch loss (nats per token)", "B_simple (sequences)", "ḡᵀHḡ (nats³)"}
    assert all(ax.get_xscale() == "symlog" for ax in panels.values())  # steps 1 ... 32: log-spaced
    assert panels["epoch loss (nats per token)"].get_legend_handles_labels()[1] == ["seen (mean of up to 2 seeds)"]
    plt.close(fig)
