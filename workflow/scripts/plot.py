"""Snakemake adapter: draw an analysis's figures from its summary.csv and manifest.json."""

import logging
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")

from tiny_llm.results.figures import plot_analysis  # noqa: E402

plot_analysis(Path(snakemake.input.summary).parent, Path(snakemake.output.png[0]).parent,
              training_norms=snakemake.params.training_norms)
