"""The configuration's reference, generated from its declarations: the workflow schema
(workflow/schemas/config.schema.yaml) is written whole from the dataclasses of
:mod:`tiny_llm.campaign.configuration` (types, literals as enums, ranges as minimums, patterns,
defaults, the fields without one as required, and the field docstrings as descriptions), and the
key tables of docs/workflow.md (analysis settings, spectra, cluster) and docs/critical-batch.md
(an experiment's keys) between their BEGIN/END marker lines from the same dataclasses, so that
nothing restates them by hand.

    python -m tiny_llm.campaign.settings_reference           # say whether the checked-in files are current
    python -m tiny_llm.campaign.settings_reference --write   # rewrite the generated parts
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.campaign.cbs import CbsExperiment
from tiny_llm.campaign.configuration import SPELLED, SpectrumSection, schema
from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.declared import json_schema
from tiny_llm.workers.settings import AnalysisSettings

__all__ = ["SECTIONS", "Section", "check", "docs_table", "render", "schema_text"]

REPO = Path(__file__).resolve().parents[3]
SCHEMA = Path("workflow/schemas/config.schema.yaml")
DOCS = Path("docs/workflow.md")
HEADER = (
    "# Generated from tiny_llm.campaign.configuration (python -m tiny_llm.campaign.settings_reference --write):\n"
    "# change the dataclasses, not this file (a test fails when they differ).\n"
)


@dataclass(frozen=True)
class Section:
    """One documented table of keys: its key, its class, None's spelling per field, the path the table
    writes before each key, its page, and whether it is an entry of a mapping keyed by name (its keys
    written alone)."""

    key: str
    cls: type
    spelled: dict[str, str]
    prefix: str = "analyses.<name>."
    """What the docs table writes before the section's key (the configuration's path to it)."""
    docs: Path = DOCS
    """The page of its table."""
    entry: bool = False
    """An entry of a mapping keyed by name: the table names its keys alone."""

    def properties(self) -> dict[str, dict[str, Any]]:
        return json_schema(self.cls, self.spelled)


SECTIONS = (
    Section("settings", AnalysisSettings, SPELLED),
    Section("spectrum", SpectrumSection, {}),
    Section("cluster", ClusterSettings, {}, prefix=""),
    Section("cbs", CbsExperiment, {}, prefix="", docs=Path("docs/critical-batch.md"), entry=True),
)


def schema_text() -> str:
    """The workflow schema as its file holds it."""
    return HEADER + yaml.safe_dump(schema(), sort_keys=False, allow_unicode=True, width=110)


def _markers(section: Section) -> tuple[str, str]:
    name = section.cls.__name__
    return (
        f"<!-- BEGIN generated from {name} (python -m tiny_llm.campaign.settings_reference --write) -->",
        f"<!-- END generated from {name} -->",
    )


def _cell(value: Any, spelled: str | None) -> str:
    if value is None:
        return spelled or "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def docs_table(section: Section) -> str:
    """The section's markdown table: key, default, meaning (the docstring)."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, field in section.properties().items():
        spelled = section.spelled.get(key)
        if "default" not in field:
            cell = "(required)"
        else:
            default = None if spelled is not None and field["default"] == spelled else field["default"]
            cell = _cell(default, spelled)
        meaning = field.get("description", "").replace("|", "\\|")
        name = key if section.entry else f"{section.prefix}{section.key}.{key}"
        rows.append(f"| `{name}` | {cell} | {meaning} |")
    return "\n".join(rows) + "\n"


def _replace(text: str, begin: str, end: str, body: str, where: Path) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"{where}: expected one line each of {begin!r} and {end!r}")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    indent = len(head) - len(head.rstrip(" "))
    return f"{head}{begin}\n{body}{' ' * indent}{end}{tail}"


def render(path: Path, text: str) -> str:
    """``text`` (the schema's or the docs') with every generated part as the declarations write it."""
    if path == SCHEMA:
        return schema_text()
    for section in SECTIONS:
        if path == section.docs:
            begin, end = _markers(section)
            text = _replace(text, begin, end, "\n" + docs_table(section) + "\n", path)
    return text


def check(repo: Path = REPO, write: bool = False) -> list[Path]:
    """The generated files that differ from what the declarations write (rewritten with ``write``)."""
    stale = []
    for path in (SCHEMA, *dict.fromkeys(section.docs for section in SECTIONS)):
        text = (repo / path).read_text()
        rendered = render(path, text)
        if rendered != text:
            stale.append(path)
            if write:
                (repo / path).write_text(rendered)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the generated parts")
    args = parser.parse_args(argv)
    stale = check(write=args.write)
    for path in stale:
        fix = "stale; run python -m tiny_llm.campaign.settings_reference --write"
        print(f"{path}: {'rewritten' if args.write else fix}")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
