"""Figures from a summary alone: every file drawn, aliases once, non-positive values handled."""

import json

import matplotlib.pyplot as plt
import pytest

from tiny_llm.collect import SUMMARY_COLUMNS
from tiny_llm.plots import FIGURES, _curves, _states, plot_analysis


def _write(tmp_path, consensus=False):
    rows = []
    for i, (file, tokens) in enumerate([("epoch-000.safetensors", 0), ("epoch-001.safetensors", 10),
                                        ("epoch-002.safetensors", 20), ("final.pt", 20)]):
        for case in ("seen", "unseen"):
            value = {"normalized_alignment": [-0.5, 1.0, 2.0, 2.0][i], "b_noise": ["", 3.0, 4.0, 4.0][i]}
            row = {c: 1.0 + i for c in SUMMARY_COLUMNS}
            row.update(file=file, state_key=f"k{min(i, 2)}", case=case, step=i, tokens=tokens, **value)
            if not consensus:
                row.update({c: "" for c in SUMMARY_COLUMNS if c.startswith("consensus")})
            rows.append(row)
    import pandas as pd
    pd.DataFrame(rows, columns=SUMMARY_COLUMNS).to_csv(tmp_path / "summary.csv", index=False)
    (tmp_path / "train-log.jsonl").write_text("".join(json.dumps({"tokens": t, "grad_norm": 1.0 / (t + 1)}) + "\n"
                                                      for t in range(0, 21, 5)))
    (tmp_path / "manifest.json").write_text(json.dumps({"consensus": consensus, "packed": consensus,
                                                        "run": str(tmp_path)}))


@pytest.mark.parametrize("consensus", [False, True])
def test_every_figure_is_written(tmp_path, consensus):
    _write(tmp_path, consensus)
    paths = plot_analysis(tmp_path, training_norms=True)
    assert sorted(p.name for p in paths) == sorted(f"{f}.{e}" for f in FIGURES for e in ("pdf", "png"))
    assert all(p.stat().st_size > 1000 for p in paths)


def test_aliases_are_drawn_once_and_log_axes_omit_non_positive(tmp_path):
    _write(tmp_path)
    import pandas as pd
    table = _states(pd.read_csv(tmp_path / "summary.csv"))
    assert len(table) == 6 and list(table["tokens"].unique()) == [0, 10, 20]
    fig, ax = plt.subplots()
    assert _curves(ax, table, "normalized_alignment", "x", "C0", log=True) == 2  # epoch-000 seen and unseen
    assert [len(line.get_xdata()) for line in ax.get_lines()] == [2, 2]
    plt.close(fig)


def test_missing_summary_is_explained(tmp_path):
    with pytest.raises(ValueError, match="has no summary.csv; run the workflow"):
        plot_analysis(tmp_path)
