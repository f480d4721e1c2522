"""Snakemake adapter: the critical batch size of each checkpoint beside B_simple and B_noise
(cbs.csv, branches.csv) and its figure."""

import json
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import pandas as pd  # noqa: E402

from tiny_llm.io import atomic_write_text  # noqa: E402
from tiny_llm.results.cbs import BRANCH_COLUMNS, CBS_COLUMNS, cbs_tables, draw_cbs  # noqa: E402

records = [json.loads(Path(path).read_text()) for path in snakemake.input.records]
summary = pd.read_csv(snakemake.input.summary)
p = snakemake.params
cbs, branches = cbs_tables(records, summary, p.case, p.epsilon, p.seq_len)
cbs_frame, branch_frame = pd.DataFrame(cbs, columns=CBS_COLUMNS), pd.DataFrame(branches, columns=BRANCH_COLUMNS)
title = f"{snakemake.wildcards.cbs} · B_simple and B_noise on case {p.case}"
frames = (cbs_frame.replace("", None), branch_frame.replace("", None))
draw_cbs(*frames, list(snakemake.output.figures), title, p.epsilon, bottom=min(branch_frame["batch_size"]))
atomic_write_text(snakemake.output.branches, branch_frame.to_csv(index=False))
atomic_write_text(snakemake.output.table, cbs_frame.to_csv(index=False))
