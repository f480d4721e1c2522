"""Snakemake adapter: measure an analysis's per-micro-batch timings on this node."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import torch  # noqa: E402

torch.set_num_threads(snakemake.threads)  # the rule's threads, not every core of a shared node

from tiny_llm.campaign.calibration import calibrate  # noqa: E402
from tiny_llm.campaign.timing import write_profile  # noqa: E402
from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.runtime import node_local_compile_cache  # noqa: E402
from tiny_llm.workers.settings import settings_from_dict  # noqa: E402

with node_local_compile_cache():
    entry = calibrate(config_from_dict(snakemake.params.run_config), settings_from_dict(snakemake.params.settings))
write_profile(snakemake.output.profile, entry)
