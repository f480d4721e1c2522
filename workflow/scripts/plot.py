"""Snakemake adapter: draw an analysis's figures (those its rule names) from its summary.csv and
manifest.json."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.layout import FIGURE_RULES  # noqa: E402
from tiny_llm.results.figures import plot_analysis, plot_audit  # noqa: E402

if snakemake.rule == "plot_audit":
    plot_audit(
        Path(snakemake.input.summary).parent, Path(snakemake.output.png[0]).parent, x_axis=snakemake.params.x_axis
    )
else:  # the audit's figure has its own rule: an analysis that is not audited has none
    plot_analysis(
        Path(snakemake.input.summary).parent,
        Path(snakemake.output.png[0]).parent,
        training_norms=snakemake.params.get("training_norms", False),
        audit=False,
        x_axis=snakemake.params.x_axis,
        figures=FIGURE_RULES[snakemake.rule],
    )
