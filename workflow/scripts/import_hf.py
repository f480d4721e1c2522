"""Snakemake adapter: import an analysis's Hugging Face checkpoints into its run directory."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.model.hf_positions import CheckpointSource  # noqa: E402
from tiny_llm.model.hf_runs import import_run  # noqa: E402

spec = snakemake.params.spec
hub = spec.get("hub") or [[None, None]] * len(spec["directories"])
import_run(
    [
        CheckpointSource(Path(path), step, tokens, repo, revision)
        for path, step, tokens, (repo, revision) in zip(
            spec["directories"], spec["steps"], spec["tokens"], hub, strict=True
        )
    ],
    Path(snakemake.output.receipt).parent,
    config_from_dict(spec["config"]),
    tokens_per_step=spec.get("tokens_per_step"),
    adapter=spec.get("adapter", False),
    allow_identical=spec.get("allow_identical_states", False),
)
