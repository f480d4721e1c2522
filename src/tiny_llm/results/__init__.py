"""Collected results: manifest.json and summary.csv (and spectrum.csv) from the per-state result
files (collect), the figures drawn from those files alone (drawing: how every figure is drawn;
figures: the analysis's; spectrum_figures: the spectrum's), the terminal summary (summarize), and
the campaign record that every controller run and collection appends to (record).
"""

import importlib

_HOMES = {
    "AUDIT_THRESHOLD": "manifest",
    "CONSENSUS_COLUMNS": "collect",
    "ERROR_COLUMNS": "collect",
    "STATISTICS": "collect",
    "SUMMARY_COLUMNS": "collect",
    "collect": "collect",
    "collect_spectrum": "collect",
    "validate_result": "collect",
    "AUDIT_FIGURES": "figures",
    "FIGURES": "figures",
    "plot_analysis": "figures",
    "plot_audit": "figures",
    "append_event": "record",
    "job_records": "record",
    "SPECTRUM_FIGURES": "spectrum_figures",
    "plot_spectrum": "spectrum_figures",
}
"""Each re-exported name's module, imported when the name is first asked for: the workflow's
planner imports ``results.record`` without the figures' matplotlib and pandas."""

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
