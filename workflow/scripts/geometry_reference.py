"""Snakemake adapter: cut an experiment's reference set from its token cache."""

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.config import config_from_dict  # noqa: E402
from tiny_llm.geometry.experiment import make_reference  # noqa: E402
from tiny_llm.geometry.settings import geometry_settings_from_dict  # noqa: E402
from tiny_llm.io import atomic_write_json  # noqa: E402

reference = make_reference(
    config_from_dict(snakemake.params.run_config), geometry_settings_from_dict(snakemake.params.settings)
)
atomic_write_json(snakemake.output.reference, reference)
