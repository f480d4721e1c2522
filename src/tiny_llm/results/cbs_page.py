"""The tables docs/critical-batch.md shows of a critical-batch-size experiment, written from its
``cbs.csv`` and ``rates.csv`` rows (read as text, as the files hold them) and placed between the
page's markers, so that the page holds what a run wrote and a test can hold it there.

    <!-- BEGIN tables of <name> -->
    …
    <!-- END tables of <name> -->
"""

from __future__ import annotations

import math
import re

__all__ = ["answers_table", "experiment_tables", "predictions_table", "rates_table", "replace_tables", "table_blocks"]

BLOCK = re.compile(r"<!-- BEGIN tables of (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- END tables of (?P=name) -->", re.S)
PREDICTORS = (("b_simple", "B_simple"), ("b_noise", "B_noise"), ("precond_b_noise", "B_noise,P"))
"""The noise scales whose predicted B* the page shows."""


def _number(text: str) -> str:
    if text in ("", None):
        return "–"
    value = float(text)
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _where(row: dict[str, str]) -> str:
    return f"epoch {int(row['checkpoint'].removeprefix('epoch-'))} ({int(float(row['tokens'])):,})"


def answers_table(rows: list[dict[str, str]]) -> str:
    """B* with its interval, B_crit with its interval and flags, the seeds' paired spread and the
    seeds ε needs at it, per checkpoint and rates."""
    lines = [
        "| checkpoint (tokens) | rates | B\\* | its interval | B_crit | its interval | censored | E(B) falls | "
        "paired spread | seeds (needed) |",
        "| --- | --- | ---: | --- | ---: | --- | --- | --- | ---: | --- |",
    ]
    for row in rows:
        high = _number(row["cbs_high"]) if row["cbs_high"] else "∞"
        crit = "" if not row["b_crit"] else f"[{_number(row['b_crit_low'])}, {_number(row['b_crit_high'])}]"
        rates = row["rates"] + (f" (edge: {row['lr_edge']})" if row.get("lr_edge") else "")
        lines.append(
            f"| {_where(row)} | {rates} | {row['cbs']} | [{row['cbs_low']}, {high}) "
            f"| {_number(row['b_crit'])} | {crit} "
            f"| {row['b_crit_censored'] or '–'} | {row['b_crit_violations'] or '–'} | {_number(row['paired_spread'])} "
            f"| {row['seeds']} ({row['seeds_needed'] or '> 1,000'}) |"
        )
    return "\n".join(lines)


def _prediction(row: dict[str, str], name: str) -> str:
    if not row[name]:
        return "–"
    scale = f"{_number(row[name])} ± {_number(row[name + '_se'])}"
    low, high = row[f"{name}_cbs_low"], row[f"{name}_cbs_high"]
    interval = f" [{_number(low)}, {_number(high)}]" if low else ""
    agrees = {"True": " ✓", "False": " ✗"}.get(row[f"{name}_cbs_agrees"], "")
    return f"{scale} → {_number(row[name + '_cbs'])}{interval}{agrees}"


def predictions_table(rows: list[dict[str, str]]) -> str:
    """Each noise scale ± its standard error → the B* it predicts [its interval] and whether that
    meets B*'s interval (✓ / ✗), beside the range of noise scales whose prediction would."""
    names = " | ".join(f"{label} → B\\*" for _, label in PREDICTORS)
    lines = [
        f"| checkpoint (tokens) | rates | noise scales that agree | {names} |",
        "| --- | --- | --- | " + " | ".join("---" for _ in PREDICTORS) + " |",
    ]
    for row in rows:
        low, high = (float(row[k]) for k in ("agreeing_scale_low", "agreeing_scale_high"))
        agree = (
            f"[{_number(row['agreeing_scale_low'])}, {_number(row['agreeing_scale_high'])})" if low < high else "none"
        )
        cells = " | ".join(_prediction(row, name) for name, _ in PREDICTORS)
        lines.append(f"| {_where(row)} | {row['rates']} | {agree} | {cells} |")
    return "\n".join(lines)


def rates_table(rows: list[dict[str, str]]) -> str:
    """Each checkpoint's best multiple of the rule's rate per batch size (* at the grid's edge)."""
    batches = sorted({int(r["batch_size"]) for r in rows})
    lines = ["| checkpoint (tokens) | " + " | ".join(f"B = {b}" for b in batches) + " |"]
    lines.append("| --- | " + " | ".join("---:" for _ in batches) + " |")
    for checkpoint in dict.fromkeys(r["checkpoint"] for r in rows):
        best = {int(r["batch_size"]): r for r in rows if r["checkpoint"] == checkpoint and r["best"] == "True"}
        cells = [f"{float(best[b]['lr_factor']):g}" + ("\\*" if best[b]["lr_edge"] == "True" else "") for b in batches]
        lines.append(f"| epoch {int(checkpoint.removeprefix('epoch-'))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def experiment_tables(cbs: list[dict[str, str]], rates: list[dict[str, str]]) -> str:
    """The page's block for one experiment: the answers, the predictions and, where the grid tuned
    the rates, each batch's best rate."""
    parts = [answers_table(cbs), predictions_table(cbs)]
    if len({r["lr_factor"] for r in rates}) > 1:
        parts.append(rates_table(rates))
    return "\n\n".join(parts) + "\n"


def table_blocks(page: str) -> dict[str, str]:
    """The page's blocks of tables, by experiment name."""
    return {match["name"]: match["body"] for match in BLOCK.finditer(page)}


def replace_tables(page: str, name: str, body: str) -> str:
    """The page with experiment ``name``'s block replaced by ``body``.

    Raises:
        ValueError: the page has no block for ``name``.
    """
    if name not in table_blocks(page):
        raise ValueError(f"the page has no <!-- BEGIN tables of {name} --> block")
    return BLOCK.sub(
        lambda m: (
            m.group(0) if m["name"] != name else f"<!-- BEGIN tables of {name} -->\n{body}<!-- END tables of {name} -->"
        ),
        page,
    )
