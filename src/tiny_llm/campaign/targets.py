"""The targets of ``rule all``: every run, every figure, and every (state, case) result of an
existing index (so that a deleted result counts as missing and a rerun recomputes exactly what was
lost), the seed experiments' comparisons and dashboards, and the critical-batch-size experiments'
tables and figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_llm.campaign.planned import AnalysisPlan, Campaign
from tiny_llm.campaign.studies import StudyPlan
from tiny_llm.campaign.walltimes import Walltimes
from tiny_llm.layout import FIGURE_RULES, SPECTRUM, state_result

__all__ = ["all_targets", "analysis_figures", "experiment_targets"]


def analysis_figures(planned: AnalysisPlan) -> list[str]:
    """The figures an analysis has something to draw in: the trajectory's with ``settings.trajectory``,
    the optimizer geometry's where a selected state may have its preconditioner, the audit's where it
    is audited, the spectra's with a spectrum."""
    rules = ["plot", *(["plot_trajectory"] if planned.settings.trajectory else [])]
    rules += ["plot_preconditioned"] if planned.preconditioner else []
    rules += ["plot_audit"] if planned.settings.audited else []
    if planned.spectrum:
        rules += ["plot_spectrum", *(["plot_spectrum_preconditioned"] if planned.preconditioner else [])]
    return [figure for rule in rules for figure in FIGURE_RULES[rule]]


def all_targets(campaign: Campaign, walltimes: Walltimes) -> list[str]:
    """Every run and figure, and every (state, case) result of an existing index.

    Naming the results makes a deleted result count as missing (Snakemake does not rerun a
    deleted intermediate file whose consumers are up to date), so a rerun recomputes exactly
    what was lost. The index is read directly when present (before the first run the figures
    pull in every result through collect), which keeps the first dry run's targets complete.
    """
    targets = [f"runs/{name}/trained.json" for name in campaign.trained_runs]
    targets += experiment_targets(campaign, walltimes)
    for cbs in campaign.cbs.values():
        targets += cbs.targets()
    for study in campaign.studies:
        targets += StudyPlan.targets(study)
    for name, planned in campaign.analyses.items():
        # The collected files too: a crash during collect (or their deletion) reruns collect.
        targets += [f"results/{name}/manifest.json", f"results/{name}/summary.csv"]
        figures = analysis_figures(planned)
        if planned.spectrum:
            targets.append(f"results/{name}/{SPECTRUM}")
        # A walltime waiting for a calibration: the short calibration job starts at once.
        if walltimes.calibration_pending(name):
            targets.append(f"results/timing/{name}.json")
        targets += [f"results/{name}/figures/{figure}.{ext}" for figure in figures for ext in ("pdf", "png")]
        index = Path(f"results/{name}/states.json")
        if index.exists() and not walltimes.calibration_pending(name):
            targets += [
                state_result(name, state["key"], case)
                for state in json.loads(index.read_text())["states"]
                for case in planned.cases
            ]
    return targets


def experiment_targets(campaign: Campaign, walltimes: Walltimes) -> list[str]:
    """comparison.csv and the dashboard of every experiment, and every comparison's figure."""
    targets = []
    for name in campaign.experiments:
        targets.append(f"results/{name}/comparison.csv")
        if walltimes.geometry_calibration_pending(name):  # the short calibration job starts at once
            targets.append(f"results/timing/{name}.json")
        targets += [f"results/{name}/figures/dashboard.{ext}" for ext in ("pdf", "png")]
    for name in campaign.comparisons:
        targets += [f"results/comparisons/{name}/comparison.{ext}" for ext in ("pdf", "png")]
    return targets
