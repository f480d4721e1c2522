"""Snakemake adapter: spectrum.csv of an analysis."""

import json
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from tiny_llm.results.collect import collect_spectrum  # noqa: E402

states = json.loads(Path(snakemake.input.states).read_text())
collect_spectrum(Path(snakemake.output.spectrum).parent, states, list(snakemake.params.cases))
