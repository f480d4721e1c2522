"""Snakemake adapter: validate every result of an analysis, then write manifest.json, summary.csv
and blocks.csv."""

import json
import sys
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.results.collect import collect  # noqa: E402

states = json.loads(Path(snakemake.input.states).read_text())
manifest = collect(
    Path(snakemake.output.manifest).parent,
    states,
    list(snakemake.params.cases),
    snakemake.wildcards.analysis,
    audit_threshold=snakemake.params.audit_threshold,
)
if manifest["audit"]["exceeded"]:  # on the console too, not only in the log
    audit = manifest["audit"]
    print(
        f"WARNING: analysis {snakemake.wildcards.analysis}: {len(audit['exceeded'])} rows have a precision-audit "
        f"error above {audit['threshold']:g} (largest {audit['max_relative_error']:.3g}); see "
        "'Precision audit' in docs/reading-results.md",
        file=sys.__stderr__,
    )
