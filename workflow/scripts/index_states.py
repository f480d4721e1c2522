"""Snakemake adapter: index a run's selected checkpoints into unique states; bind the output directory."""

from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

from tiny_llm.io import atomic_write_json  # noqa: E402
from tiny_llm.workers.binding import bind_output, check_output_binding  # noqa: E402
from tiny_llm.workers.index import index_states  # noqa: E402
from tiny_llm.workers.settings import settings_from_dict  # noqa: E402

output = Path(snakemake.output.states)
check_output_binding(output.parent, snakemake.params.binding)
settings = settings_from_dict(snakemake.params.settings)
states = index_states(snakemake.params.run, snakemake.params.selection, settings.consensus)  # may refuse
bind_output(output.parent, snakemake.params.binding)  # bind only what was indexed
atomic_write_json(output, states)
