"""Snakemake adapter: spectral figures of an analysis."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.layout import FIGURE_RULES  # noqa: E402
from tiny_llm.results.spectrum_figures import plot_spectrum  # noqa: E402

plot_spectrum(
    Path(snakemake.input.spectrum).parent,
    Path(snakemake.output.png[0]).parent,
    x_axis=snakemake.params.x_axis,
    figures=FIGURE_RULES[snakemake.rule],
)
