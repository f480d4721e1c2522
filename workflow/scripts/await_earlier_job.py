"""Snakemake adapter: wait for the Slurm job of an earlier controller that computes this output."""

import sys
import time

log = open(snakemake.log[0], "w")
sys.stderr = log

from tiny_llm.campaign.slurm_jobs import wait_for_job  # noqa: E402


def say(message):
    print(f"{time.strftime('%H:%M:%S')} {message}", file=log, flush=True)


job = str(snakemake.resources.earlier_job)
say(f"re-attached: Slurm job {job}, submitted by an earlier controller, computes {', '.join(snakemake.output)}")
wait_for_job(job, list(snakemake.output), poll_seconds=float(snakemake.resources.poll_seconds), log=say)
