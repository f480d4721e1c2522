"""Snakemake adapter: the held-out loss of each branch run of one checkpoint."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.io import atomic_write_json  # noqa: E402
from tiny_llm.training.branches import held_out_loss  # noqa: E402

spec = snakemake.params.spec
base = config_from_dict(spec["base"])
branches = [
    {"run": run, **info, "loss": held_out_loss(f"runs/{run}/final.pt", base, spec["blocks"], spec["device"])}
    for run, info in spec["branches"].items()
]
record = {key: spec[key] for key in ("checkpoint", "step", "tokens")}
atomic_write_json(snakemake.output.record, {**record, "eval_sequences": len(spec["blocks"]), "branches": branches})
