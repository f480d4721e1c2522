"""Snakemake adapter: a study across seeds, its seeds' analyses side by side (seeds.csv, figure)."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.results.seeds import write_study  # noqa: E402

out_dir = Path(snakemake.output.table).parent
write_study(snakemake.wildcards.study, dict(snakemake.params.summaries), out_dir, list(snakemake.params.shared))
