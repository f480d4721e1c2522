"""Collected results: manifest.json and summary.csv (and spectrum.csv) from the per-state result
files (collect), the figures drawn from those files alone (drawing: how every figure is drawn;
figures: the analysis's; spectrum_figures: the spectrum's), the terminal summary (summarize), and
the campaign record that every controller run and collection appends to (record).
"""

from tiny_llm.results.collect import (
    CONSENSUS_COLUMNS,
    ERROR_COLUMNS,
    STATISTICS,
    SUMMARY_COLUMNS,
    collect,
    collect_spectrum,
    validate_result,
)
from tiny_llm.results.figures import AUDIT_FIGURES, FIGURES, plot_analysis, plot_audit
from tiny_llm.results.manifest import AUDIT_THRESHOLD
from tiny_llm.results.record import append_event, job_records
from tiny_llm.results.spectrum_figures import SPECTRUM_FIGURES, plot_spectrum

__all__ = [
    "AUDIT_THRESHOLD",
    "CONSENSUS_COLUMNS",
    "ERROR_COLUMNS",
    "AUDIT_FIGURES",
    "FIGURES",
    "SPECTRUM_FIGURES",
    "STATISTICS",
    "SUMMARY_COLUMNS",
    "append_event",
    "collect",
    "collect_spectrum",
    "job_records",
    "plot_analysis",
    "plot_audit",
    "plot_spectrum",
    "validate_result",
]
