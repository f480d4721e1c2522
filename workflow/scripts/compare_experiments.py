"""Snakemake adapter: compare several seed experiments in one figure."""

import sys

sys.stderr = open(snakemake.log[0], "w")

from tiny_llm.geometry.figures import compare_experiments  # noqa: E402

entry = snakemake.params.entry
compare_experiments(list(snakemake.input.comparisons), entry.get("labels") or entry["experiments"],
                    entry.get("metrics"), list(snakemake.output.figures))
