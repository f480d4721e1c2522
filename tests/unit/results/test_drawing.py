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
