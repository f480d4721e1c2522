"""Snakemake adapter: compare several seed experiments in one figure."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.geometry.figures import compare_experiments  # noqa: E402

entry = snakemake.params.entry
compare_experiments(
    list(snakemake.input.comparisons),
    entry.get("labels") or entry["experiments"],
    entry.get("metrics"),
    list(snakemake.output.figures),
)
