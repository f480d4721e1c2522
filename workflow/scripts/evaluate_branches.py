"""Snakemake adapter: the held-out loss curve of each branch run of one checkpoint."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.io import atomic_write_json  # noqa: E402
from tiny_llm.training.branches import measure_branches  # noqa: E402

atomic_write_json(snakemake.output.record, measure_branches(snakemake.params.spec))
