"""Snakemake adapter: spectral figures of an analysis."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from tiny_llm.results.figures import plot_spectrum  # noqa: E402

plot_spectrum(Path(snakemake.input.spectrum).parent, Path(snakemake.output.png[0]).parent)
