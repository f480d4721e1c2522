"""Snakemake adapter: check that every case of a state is complete and write the state's receipt."""

import json

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.io import atomic_write_json  # noqa: E402
from tiny_llm.runtime import remove_shared_compile_cache  # noqa: E402

results = [json.loads(open(path).read()) for path in snakemake.input.results]
for path, result in zip(snakemake.input.results, results, strict=True):
    if result["state"]["key"] != snakemake.wildcards.key:
        raise ValueError(f"{path} holds state {result['state']['key']}, expected {snakemake.wildcards.key}")
atomic_write_json(
    snakemake.output.receipt,
    {"key": snakemake.wildcards.key, "cases": [r["case"] for r in results], "identity": results[0]["identity"]["hash"]},
)
remove_shared_compile_cache(snakemake.wildcards.key)  # the state's compile cache on this node
