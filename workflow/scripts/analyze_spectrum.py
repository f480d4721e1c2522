"""Snakemake adapter: the spectrum of one parameter state on one data case."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.runtime import announce_job, devices_of_the_job, node_local_compile_cache  # noqa: E402
from tiny_llm.workers.ranks import run_on_ranks  # noqa: E402

announce_job(snakemake.resources, snakemake.threads)  # attempt and requested resources, in the result
job = f"{snakemake.rule} {snakemake.wildcards.analysis}/{snakemake.wildcards.key}/{snakemake.wildcards.case}"
# in a cluster job: its GPUs for one case at a time; both cases of the state share the compile cache
with devices_of_the_job(job), node_local_compile_cache(shared_by=snakemake.wildcards.key):
    # gpus_per_job > 1: torchrun starts that many ranks (threads each); rank 0 writes the result
    run_on_ranks(
        "analyze_spectrum",
        {
            "run_dir": snakemake.params.run,
            "checkpoints": list(snakemake.params.aliases),
            "case": snakemake.wildcards.case,
            "settings": dict(snakemake.params.settings),
            "spectrum": dict(snakemake.params.spectrum),
            "expect_key": snakemake.wildcards.key,
            "successor": snakemake.params.successor.state,  # the next state, or None
            "order": snakemake.params.order.case,  # a training order's case, or None (the cache)
        },
        snakemake.output.result,
        ranks=snakemake.resources.ranks,
        nodes=snakemake.resources.nodes,
        threads=snakemake.threads,
    )
