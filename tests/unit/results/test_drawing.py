"""How every figure is drawn: tick labels, the collected table checked before drawing, curves that
say what they could not draw, the title's stamp, and the PDF and PNG of a finished figure."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from tiny_llm.results.drawing import Notes, curves, engineering, finish, read_table, stamp


def test_tick_labels_are_in_engineering_notation():
    assert [engineering(v) for v in (0, 999, 1000, 2_500_000, 7e9, 3e12)] == ["0", "999", "1k", "2.5M", "7B", "3T"]


def test_a_collected_table_is_checked_before_anything_is_drawn(tmp_path):
    good = tmp_path / "summary.csv"
    pd.DataFrame({"file": ["a"], "state_key": ["k"], "case": ["seen"], "step": [3], "loss": [1.0]}).to_csv(good)
    assert read_table(good, numbers=("loss",))["loss"].tolist() == [1.0]
    with pytest.raises(ValueError, match=r"summary.csv lacks the columns noise; collect the analysis again"):
        read_table(good, numbers=("noise",))
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"file": ["a"], "state_key": ["k"], "case": ["seen"], "step": ["three"]}).to_csv(bad)
    with pytest.raises(ValueError, match="the column step holds values a collected table does not"):
        read_table(bad)


def test_curves_omit_nulls_and_non_positive_values_on_a_log_axis_and_say_so():
    table = pd.DataFrame(
        {"case": ["seen"] * 4, "x": [1, 2, 3, 4], "y": [1.0, None, -2.0, 4.0], "y_se": [0.1, 0.1, 0.1, 5.0]}
    )
    fig, ax = plt.subplots()
    notes = Notes()
    omitted = curves(ax, table, "y", "y", "C0", log=True, notes=notes)
    plt.close(fig)
    assert omitted == 1  # off the log axis; the null is noted apart
    text = " ".join(notes.text().split())
    assert "null, omitted: y (seen) ×1" in text and "≤ 0, off the log axis: y (seen) ×1" in text
    assert "error bar cut at a tenth of the value: y (seen) ×1" in text  # 4 ± 5 reaches below zero


def test_a_finished_figure_is_titled_with_its_stamp_and_saved_as_pdf_and_png(tmp_path):
    context = {"analysis": "demo", "settings": {"dtype": "float64", "noise_samples": 4, "random_samples": 2}}
    fig, ax = plt.subplots()
    ax.plot([0, 1_000_000], [1, 2], label="seen")
    paths = finish(ax, tmp_path / "loss", "loss (nats)", context, "a note")
    assert [p.name for p in paths] == ["loss.pdf", "loss.png"] and all(p.stat().st_size > 0 for p in paths)
    assert stamp(context).startswith("demo · float64") and ax.get_ylabel() == "loss (nats)"
    assert "a note" in fig.axes[0].get_title(loc="left")


def test_the_stamp_calls_every_batch_exact_only_from_the_documented_minimum_on():
    def stamped(samples, batches):
        return stamp(
            {
                "analysis": "a",
                "settings": {"dtype": "float64", "noise_samples": samples, "random_samples": 2},
                "batch_sizes": {"seen": {"epoch_batches": batches}},
            }
        )

    assert stamped(None, 8) == "a · float64 · S_v = all 8 (exact) · S_r = 2"
    assert stamped(32, 4) == "a · float64 · S_v = all 4 (fewer than 8: rough) · S_r = 2"
    assert stamped(2, 4) == "a · float64 · S_v = 2 of 4 (fewer than 8: rough) · S_r = 2"
    assert stamped(4, 16) == "a · float64 · S_v = 4 · S_r = 2"


def test_every_case_has_its_own_line_style_fill_and_shade_and_statistics_their_marker():
    fig, ax = plt.subplots()
    cases = ["seen", "unseen", "offset", "recent", "step"]
    table = pd.DataFrame({"case": cases * 2, "x": [1.0] * 5 + [2.0] * 5, "v": [1.0] * 10, "w": [2.0] * 10})
    curves(ax, table, "v", "v", "C0")
    curves(ax, table, "w", "w", "C0", marker="s")
    lines = ax.get_lines()
    looks = {(str(line.get_linestyle()), line.get_fillstyle(), line.get_color()) for line in lines[:5]}
    assert len(looks) == 5 and [line.get_label() for line in lines[:5]] == [f"v ({case})" for case in cases]
    assert {line.get_marker() for line in lines[:5]} == {"o"} and {line.get_marker() for line in lines[5:]} == {"s"}
    plt.close(fig)
