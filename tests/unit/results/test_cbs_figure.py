"""The critical-batch figure: drawn from cbs.csv's and branches.csv's tables (blank cells as None),
a B* the grid cannot bound above included, and written atomically to every output."""

import pandas as pd

from tiny_llm.results.cbs_figure import draw_cbs


def _tables():
    cbs = pd.DataFrame(
        {
            "checkpoint": ["epoch-001", "epoch-002"],
            "tokens": [1024, 2048],
            "base_batch": [2, 2],
            "cbs": [4, 8],
            "cbs_tokens": [256.0, 512.0],
            "cbs_high_tokens": [512.0, None],  # the second not bounded above by the grid
            "b_crit_tokens": [300.0, None],
            "b_crit_low_tokens": [200.0, None],
            "b_crit_high_tokens": [float("inf"), None],
            "b_noise_cbs_tokens": [256.0, 512.0],
            "b_noise_cbs_low": [3.0, 6.0],
            "b_noise_cbs_high": [5.0, float("inf")],
            "b_simple_tokens": [128.0, 400.0],
            "b_simple_se": [0.5, None],
            "b_noise_tokens": [192.0, 640.0],
            "b_noise_se": [1.0, 2.0],
        }
    )
    branches = pd.DataFrame(
        [
            (checkpoint, batch, batch * 64, loss, se)
            for checkpoint, losses in (("epoch-001", (3.0, 3.0, 3.005, 3.1)), ("epoch-002", (2.5, 2.5, 2.5, 2.505)))
            for batch, loss, se in zip((1, 2, 4, 8), losses, (0.01, 0.01, None, 0.02), strict=True)
        ],
        columns=["checkpoint", "batch_size", "batch_tokens", "loss", "loss_se"],
    )
    return cbs, branches


def test_the_figure_is_written_to_every_output_and_nothing_else(tmp_path):
    outputs = [tmp_path / "cbs.pdf", tmp_path / "cbs.png"]
    draw_cbs(*_tables(), outputs, "demo · ε = 0.01", 0.01)
    assert all(path.stat().st_size > 10_000 for path in outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cbs.pdf", "cbs.png"]  # no staging file left


def test_the_noise_scales_in_the_optimizers_geometry_are_drawn_where_measured(tmp_path):
    import matplotlib.pyplot as plt

    from tiny_llm.results.cbs_figure import _answers

    cbs, _ = _tables()
    labels = {}
    measured = {
        "precond_b_simple_tokens": [150.0, 500.0],
        "precond_b_simple_se": [0.4, None],
        "precond_b_noise_tokens": [400.0, 900.0],
        "precond_b_noise_se": [1.5, 2.5],
    }
    for name, extra in (("plain", {}), ("adam", measured)):
        fig, ax = plt.subplots()
        _answers(ax, cbs.assign(**extra))
        labels[name] = ax.get_legend_handles_labels()[1]
        plt.close(fig)
    added = [label for label in labels["adam"] if label not in labels["plain"]]
    assert added == ["B_simple,P (the optimizer's geometry)", "B_noise,P (the optimizer's geometry)"]
