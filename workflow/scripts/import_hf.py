"""Snakemake adapter: import an analysis's Hugging Face checkpoints into its run directory."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.model.hf_runs import import_run  # noqa: E402

spec = snakemake.params.spec
import_run(
    spec["directories"],
    Path(snakemake.output.receipt).parent,
    config_from_dict(spec["config"]),
    steps=spec["steps"],
    tokens=spec["tokens"],
    tokens_per_step=spec.get("tokens_per_step"),
    adapter=spec.get("adapter", False),
)
