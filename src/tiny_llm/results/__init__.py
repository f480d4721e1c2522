"""Collected results: manifest.json and summary.csv from the per-state result files (collect),
spectrum.csv from the spectra (spectrum_table), the figures drawn from those files alone
(drawing: how every figure is drawn; figures: the analysis's; spectrum_figures: the spectrum's),
the terminal summary (summarize), and the campaign record that every controller run and
collection appends to (record).

Names are imported on first use, so that the workflow's planner, which writes the campaign record,
imports no matplotlib or pandas.
"""

from tiny_llm.lazy import exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.results.collect": [
            "CONSENSUS_COLUMNS",
            "ERROR_COLUMNS",
            "STATISTICS",
            "SUMMARY_COLUMNS",
            "collect",
            "validate_result",
        ],
        "tiny_llm.results.spectrum_table": ["collect_spectrum"],
        "tiny_llm.results.figures": ["AUDIT_FIGURES", "FIGURES", "plot_analysis", "plot_audit"],
        "tiny_llm.results.manifest": ["AUDIT_THRESHOLD"],
        "tiny_llm.results.record": ["append_event", "job_records"],
        "tiny_llm.results.spectrum_figures": ["SPECTRUM_FIGURES", "plot_spectrum"],
    },
)
