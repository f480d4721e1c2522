"""Snakemake adapter: measure one checkpoint of one run of a seed experiment on its reference set."""

import json
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)

from tiny_llm.geometry.experiment import measure_checkpoint  # noqa: E402
from tiny_llm.geometry.settings import geometry_settings_from_dict  # noqa: E402

checkpoint = snakemake.wildcards.checkpoint
measure_checkpoint(
    Path(snakemake.input.trained).parent,
    f"{checkpoint}.safetensors",
    int(checkpoint.split("-")[1]),
    json.loads(Path(snakemake.input.reference).read_text()),
    geometry_settings_from_dict(snakemake.params.settings),
    snakemake.output.record,
)
