"""Snakemake adapter: train (or resume) one run, then write its receipt."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake, mode="a")  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.io import atomic_write_json  # noqa: E402
from tiny_llm.training.loop import run_summary, train  # noqa: E402

run_dir = Path(snakemake.output.receipt).parent
train(config_from_dict(snakemake.params.run_config), run_dir, device=snakemake.params.device)
atomic_write_json(snakemake.output.receipt, run_summary(run_dir))
