"""Snakemake adapter: the spectrum of one parameter state on one data case."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.runtime import announce_job, node_local_compile_cache  # noqa: E402
from tiny_llm.workers.spectrum import analyze_spectrum, spectrum_settings_from_dict  # noqa: E402
from tiny_llm.workers.state import settings_from_dict  # noqa: E402

announce_job(snakemake.resources, snakemake.threads)  # attempt and requested resources, in the result
with node_local_compile_cache(shared_by=snakemake.wildcards.key):  # both cases of the state
    analyze_spectrum(snakemake.params.run, list(snakemake.params.aliases), snakemake.wildcards.case,
                     settings_from_dict(snakemake.params.settings), spectrum_settings_from_dict(snakemake.params.spectrum),
                     snakemake.output.result, expect_key=snakemake.wildcards.key)
