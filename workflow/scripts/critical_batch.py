"""Snakemake adapter: the critical batch size of each checkpoint three ways beside B_simple and
B_noise (cbs.csv, branches.csv, rates.csv, fits.csv, curves.csv) and its figure."""

import json
from pathlib import Path

from tiny_llm.campaign.jobs import job_log

job_log(snakemake)  # the log gets everything; a failure ends with one "error:" line

import pandas as pd  # noqa: E402

from tiny_llm.io import atomic_write_text  # noqa: E402
from tiny_llm.results.cbs import COLUMNS, cbs_tables  # noqa: E402
from tiny_llm.results.cbs_figure import draw_cbs  # noqa: E402

records = [json.loads(Path(path).read_text()) for path in snakemake.input.records]
summary = pd.read_csv(snakemake.input.summary)
p = snakemake.params
tables = cbs_tables(records, summary, p.case, p.epsilon, p.seq_len, p.base_batch)
frames = {name: pd.DataFrame(rows, columns=COLUMNS[name]) for name, rows in tables.items()}
title = f"{snakemake.wildcards.cbs} · B_simple and B_noise on case {p.case}"
shown = [frames[name].replace("", None) for name in ("cbs", "branches")]
draw_cbs(*shown, list(snakemake.output.figures), title, p.epsilon)
for name in ("curves", "fits", "rates", "branches"):
    atomic_write_text(snakemake.output[name], frames[name].to_csv(index=False))
atomic_write_text(snakemake.output.table, frames["cbs"].to_csv(index=False))
