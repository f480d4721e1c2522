"""Figures from a summary alone: every file drawn, aliases once, non-positive values handled."""

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from tiny_llm.results import figures as plots
from tiny_llm.results.collect import SUMMARY_COLUMNS
from tiny_llm.results.drawing import Notes, curves, states
from tiny_llm.results.figures import AUDIT_FIGURES, FIGURES, plot_analysis


def _write(tmp_path, consensus=False):
    rows = []
    for i, (file, tokens) in enumerate(
        [("epoch-000.safetensors", 0), ("epoch-001.safetensors", 10), ("epoch-002.safetensors", 20), ("final.pt", 20)]
    ):
        for case in ("seen", "unseen"):
            value = {"normalized_alignment": [-0.5, 1.0, 2.0, 2.0][i], "b_noise": ["", 3.0, 4.0, 4.0][i]}
            row = {c: 0.05 if c.endswith("_se") else 1.0 + i for c in SUMMARY_COLUMNS}
            row.update(file=file, state_key=f"k{min(i, 2)}", case=case, step=i, tokens=tokens, **value)
            if not consensus:
                row.update({c: "" for c in SUMMARY_COLUMNS if c.startswith("consensus")})
            rows.append(row)
    pd.DataFrame(rows, columns=SUMMARY_COLUMNS).to_csv(tmp_path / "summary.csv", index=False)
    (tmp_path / "train-log.jsonl").write_text(
        "".join(json.dumps({"tokens": t, "grad_norm": 1.0 / (t + 1)}) + "\n" for t in range(0, 21, 5))
    )
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "analysis": "my-analysis",
                "consensus": consensus,
                "packed": consensus,
                "run": str(tmp_path),
                "settings": {"dtype": "float32", "amp": True, "noise_samples": None, "random_samples": 7},
                "batch_sizes": {case: {"effective_batch_size": 16, "epoch_batches": 8} for case in ("seen", "unseen")},
                "audit": {"audited_rows": 6 if consensus else 0},
            }
        )
    )


@pytest.mark.parametrize("consensus", [False, True])
def test_every_figure_is_written(tmp_path, consensus):
    _write(tmp_path, consensus)
    paths = plot_analysis(tmp_path, training_norms=True)
    drawn = FIGURES + (AUDIT_FIGURES if consensus else [])  # the audit's figure only where there was an audit
    assert sorted(p.name for p in paths) == sorted(f"{f}.{e}" for f in drawn for e in ("pdf", "png"))
    assert all(p.stat().st_size > 1000 for p in paths)


def test_aliases_are_drawn_once_and_log_axes_omit_non_positive(tmp_path):
    _write(tmp_path)
    table = states(pd.read_csv(tmp_path / "summary.csv"))
    assert len(table) == 6 and list(table["tokens"].unique()) == [0, 10, 20]
    fig, ax = plt.subplots()
    notes = Notes()
    assert curves(ax, table, "normalized_alignment", "x", "C0", log=True, notes=notes) == 2  # epoch-000 both cases
    assert [len(c.lines[0].get_xdata()) for c in ax.containers] == [2, 2]  # error bars: the _se column is there
    assert notes.text() == "≤ 0, off the log axis: x (seen) ×1, x (unseen) ×1"
    curves(ax, table, "b_noise", "B", "C1", log=True, notes=notes)
    assert " ".join(notes.text().split()).endswith("; null, omitted: B (seen) ×1, B (unseen) ×1")
    plt.close(fig)


def test_error_bars_come_from_the_standard_errors_and_are_cut_on_log_axes(tmp_path):
    table = pd.DataFrame({"tokens": [0, 10], "case": ["seen", "seen"], "v": [1.0, 2.0], "v_se": [0.25, 3.0]})
    fig, ax = plt.subplots()
    notes = Notes()
    curves(ax, table, "v", "v", "C0", log=True, notes=notes)
    bars = ax.containers[0].lines[2][0].get_segments()
    assert [tuple(segment[:, 1]) for segment in bars] == [(0.75, 1.25), pytest.approx((0.2, 5.0))]
    assert notes.text() == "error bar cut at a tenth of the value: v (seen) ×1"
    plt.close(fig)


def test_figures_explain_themselves(tmp_path, monkeypatch):
    """Title with analysis and settings, the training batch on batch_sizes, legends outside the
    axes, and at least three labelled ticks on a log axis that spans less than a decade."""
    _write(tmp_path)
    figures = {}
    original = plots.finish

    def spy(ax, path, *args, **kwargs):
        fig, name = ax.figure, path.name
        paths = original(ax, path, *args, **kwargs)
        figures[name] = fig
        return paths

    monkeypatch.setattr(plots, "finish", spy)
    plot_analysis(tmp_path)
    for name, fig in figures.items():
        title = fig.axes[0].get_title(loc="left")
        assert title.startswith("my-analysis · float32 + bf16 autocast · S_v = all 8 (exact) · S_r = 7"), name
        fig.canvas.draw()
        legend = fig.legends[0].get_window_extent()
        assert all(legend.y1 <= ax.get_window_extent().y0 for ax in fig.axes), name  # below every axes
    batch = figures["batch_sizes"].axes[0]
    assert any(
        line.get_label() == "training batch B = 16" and set(line.get_ydata()) == {16} for line in batch.get_lines()
    )
    title = " ".join(batch.get_title(loc="left").split())
    assert "null, omitted: B_noise (critical) (seen) ×1" in title and title.endswith("(B_noise is null where ḡᵀHḡ ≤ 0)")
    norms = figures["gradient_norms"].axes[0]
    low, high = norms.get_ylim()
    labelled = [t for t in norms.yaxis.get_majorticklabels() if t.get_text() and low <= t.get_position()[1] <= high]
    assert high / low < 10 and len(labelled) >= 3


def test_missing_summary_is_explained(tmp_path):
    with pytest.raises(ValueError, match="has no summary.csv; run the workflow"):
        plot_analysis(tmp_path)


@pytest.mark.parametrize(
    "table, text, message",
    [
        ("blocks.csv", "", r"blocks.csv is not a collected table \(No columns to parse"),
        ("blocks.csv", "file,case,block\nx,seen,embedding,extra\n", "blocks.csv lacks the columns state_key, step"),
        (
            "blocks.csv",
            "file,state_key,case,step,tokens,block,b_simple\nf,k,seen,1,10,embedding,lots\n",
            "blocks.csv: the column b_simple holds values a collected table does not",
        ),
        ("summary.csv", "file,state_key,case,step\nf,k,seen,early\n", "summary.csv: the column step holds values"),
    ],
)
def test_a_broken_table_is_named_and_nothing_is_drawn(tmp_path, table, text, message):
    _write(tmp_path)
    (tmp_path / table).write_text(text)
    with pytest.raises(ValueError, match=message + ".*; collect the analysis again"):
        plot_analysis(tmp_path)
    assert not (tmp_path / "figures").exists()


def test_the_x_axis_is_tokens_when_known_else_steps_in_engineering_notation(tmp_path, monkeypatch):
    """Tokens of 1e5 and more read as 100k, 1.2M; unknown tokens (blank cells) or x_axis step put
    steps on the axis; a run without a training log is drawn without its curves, with a note."""
    _write(tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    summary["tokens"] = summary["tokens"] * 60_000
    summary.to_csv(tmp_path / "summary.csv", index=False)
    figures = {}
    original = plots.finish

    def spy(ax, path, *args, **kwargs):
        fig, name = ax.figure, path.name
        paths = original(ax, path, *args, **kwargs)
        fig.canvas.draw()
        figures[name] = (
            ax.get_xlabel(),
            [t.get_text() for t in ax.get_xticklabels()],
            " ".join(fig.axes[0].get_title(loc="left").split()),
        )
        return paths

    monkeypatch.setattr(plots, "finish", spy)
    plot_analysis(tmp_path, training_norms=True)
    _, ticks, _ = figures["loss"]
    assert any(t.endswith("M") for t in ticks) and all(len(t) <= 5 for t in ticks), ticks
    assert figures["loss"][0] == "training tokens"
    (tmp_path / "train-log.jsonl").unlink()  # an imported run: no training log
    summary["tokens"] = summary["tokens"].astype(object)
    summary.loc[summary["file"] == "epoch-001.safetensors", "tokens"] = ""
    summary.to_csv(tmp_path / "summary.csv", index=False)
    plot_analysis(tmp_path, training_norms=True)
    assert figures["loss"][0] == figures["gradient_norms"][0] == "training step"
    assert "no training log in" in figures["gradient_norms"][2] and "no training log in" in figures["loss"][2]
    table = states(pd.read_csv(tmp_path / "summary.csv"), "tokens")
    assert table.attrs["xlabel"] == "training step" and "tokens unknown" in table.attrs["x_note"]
    with pytest.raises(ValueError, match="plots.x_axis: expected one of auto, tokens, step"):
        states(summary, "epochs")


def test_block_styles_keep_a_deep_models_legend_short():
    """Beyond four layers the legend names only the first and the last layer of each kind; attention
    and MLP get different colour families, darker with depth."""
    from tiny_llm.results.figures import _block_style

    labels = [_block_style(f"layer {i} mlp", 12)[1] for i in range(12)]
    assert [label for label in labels if not label.startswith("_")] == ["layer 0 mlp", "layer 11 mlp"]
    assert all(not _block_style(f"layer {i} attention", 3)[1].startswith("_") for i in range(3))
    shallow, deep = _block_style("layer 0 attention", 12)[0], _block_style("layer 11 attention", 12)[0]
    assert sum(deep[:3]) < sum(shallow[:3])  # darker
    assert _block_style("layer 0 attention", 12)[0] != _block_style("layer 0 mlp", 12)[0]
    assert _block_style("norms", 12) == ("0.5", "norms")


def test_log_spaced_checkpoints_get_a_log_axis_and_evenly_spaced_ones_a_linear_one(tmp_path, monkeypatch):
    """Pythia's revisions (steps 0, 1, 2, 4, ... then every 1000): a symmetric log x-axis, linear
    below the first positive position, so that the early checkpoints are not crowded at 0; the
    demo's evenly spaced epochs keep a linear one."""
    _write(tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert not states(summary).attrs["x_log"]
    steps = sorted(summary["step"].unique())
    log_spaced = dict(zip(steps, [0, 1, 512, 143_000][: len(steps)], strict=False))
    summary["step"] = summary["step"].map(log_spaced)
    summary["tokens"] = summary["step"] * 2_097_152
    summary.to_csv(tmp_path / "summary.csv", index=False)
    table = states(summary)
    assert table.attrs["x_log"] and table.attrs["x_linthresh"] == 2_097_152
    scales = {}
    original = plots.finish

    def spy(ax, path, *args, **kwargs):
        paths = original(ax, path, *args, **kwargs)
        scales[path.name] = ax.get_xscale()
        return paths

    monkeypatch.setattr(plots, "finish", spy)
    plot_analysis(tmp_path, training_norms=False)
    assert scales["loss"] == scales["batch_sizes"] == "symlog"


def test_step_loss_keeps_every_checkpoint_legible_and_batch_sizes_draw_the_training_batch(tmp_path, monkeypatch):
    """An initialisation's step of −20 nats beside later ones of 1e-3: a symmetric log axis, linear
    only within the smallest change, so every checkpoint's change is read off; the training batch
    is the training's, not the noise batch's."""
    _write(tmp_path)
    table = pd.read_csv(tmp_path / "summary.csv")
    changes = {"epoch-000.safetensors": -20.7, "epoch-001.safetensors": -2e-3, "epoch-002.safetensors": 1e-3}
    table["actual_loss_change"] = table["file"].map(changes)
    table["predicted_loss_change"] = table["actual_loss_change"] * 1.1
    table.to_csv(tmp_path / "summary.csv", index=False)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for sizes in manifest["batch_sizes"].values():
        sizes["training_batch_size"] = 1024
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    figures = {}
    original = plots.finish

    def spy(ax, path, *args, **kwargs):
        figures[path.name] = ax.figure
        return original(ax, path, *args, **kwargs)

    monkeypatch.setattr(plots, "finish", spy)
    plot_analysis(tmp_path)
    step = figures["step_loss"].axes[0]
    assert step.get_yscale() == "symlog" and "linear within ±0.001" in step.get_title(loc="left")
    batch = figures["batch_sizes"].axes[0]
    assert any(line.get_label() == "training batch B = 1024" for line in batch.get_lines())
