"""The spectrum's figures from spectrum.csv and the saved SLQ nodes alone: the top eigenvalues (an
unconverged one ringed and said), the SLQ density of all states and of each, the block error."""

import json

import pandas as pd
import pytest

import tiny_llm.results.spectrum_figures as spectrum_figures
from tiny_llm.results.spectrum_figures import SPECTRUM_FIGURES, plot_spectrum


def _analysis(folder):
    rows = []
    for step, key in ((0, "a" * 16), (10, "b" * 16)):
        for case in ("seen", "unseen"):
            rows.append(
                {
                    "file": f"epoch-{step:03d}.safetensors",
                    "state_key": key,
                    "case": case,
                    "step": step,
                    "tokens": step * 64,
                    "la_eigenvalue_1": 2.0 + step,
                    "la_converged_1": step == 0,
                    "block_tensor_relative_error": 0.5,
                    "block_layer_relative_error": 0.3,
                }
            )
            saved = folder / "spectra" / key / f"{case}.json"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps({"slq": {"nodes": [[0.0, 1.0, 2.0 + step]], "weights": [[0.5, 0.3, 0.2]]}}))
    pd.DataFrame(rows).to_csv(folder / "spectrum.csv", index=False)
    return folder


def test_every_spectral_figure_is_drawn_and_an_unconverged_eigenvalue_is_said(tmp_path, monkeypatch):
    notes = {}
    original = spectrum_figures.finish

    def spy(ax, path, ylabel, context, note="", **kwargs):
        notes[path.name] = note
        return original(ax, path, ylabel, context, note, **kwargs)

    monkeypatch.setattr(spectrum_figures, "finish", spy)
    paths = plot_spectrum(_analysis(tmp_path / "demo"))
    names = {p.name for p in paths}
    assert {f"{name}.png" for name in SPECTRUM_FIGURES} <= names and all(p.stat().st_size > 0 for p in paths)
    assert len(list((tmp_path / "demo/figures/slq_states").glob("*.pdf"))) == 2  # one density per state
    assert "2 not converged (red rings): raise spectrum.lanczos_steps" in notes["top_eigenvalues"]


def test_an_analysis_without_spectra_is_refused_naming_what_to_run(tmp_path):
    with pytest.raises(ValueError, match="has no spectrum.csv; run the workflow with spectrum enabled first"):
        plot_spectrum(tmp_path)
