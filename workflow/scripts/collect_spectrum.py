"""Snakemake adapter: spectrum.csv of an analysis."""

import json
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.results.spectrum_table import collect_spectrum  # noqa: E402

states = json.loads(Path(snakemake.input.states).read_text())
collect_spectrum(Path(snakemake.output.spectrum).parent, states, list(snakemake.params.cases))
