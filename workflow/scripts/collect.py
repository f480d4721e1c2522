"""Snakemake adapter: validate every result of an analysis, then write manifest.json and summary.csv."""

import json
import logging
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")

from tiny_llm.collect import collect  # noqa: E402

states = json.loads(Path(snakemake.input.states).read_text())
collect(Path(snakemake.output.manifest).parent, states, list(snakemake.params.cases), snakemake.wildcards.analysis)
