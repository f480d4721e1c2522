"""Snakemake adapter: compare the seeds of an experiment (comparison.csv) and draw its dashboard."""

from collections import defaultdict
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.geometry.comparison import compare, write_comparison  # noqa: E402
from tiny_llm.geometry.figures import dashboard  # noqa: E402

records = defaultdict(list)
for path in snakemake.input.records:
    records[Path(path).parent.name].append(path)
write_comparison(compare(dict(records), dict(snakemake.params.roles)), snakemake.output.comparison)
dashboard(snakemake.output.comparison, list(snakemake.output.figures), snakemake.wildcards.experiment)
