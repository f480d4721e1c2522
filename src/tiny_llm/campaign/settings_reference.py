"""The settings' reference, generated from their declarations: the ``settings`` and ``spectrum``
properties of the workflow schema (workflow/schemas/config.schema.yaml), its ``cluster`` section,
a ``cbs_experiments`` entry, and their tables in docs/workflow.md and docs/critical-batch.md, each
between its BEGIN/END marker lines, are written from the dataclasses (``AnalysisSettings``,
``SpectrumSettings``, ``ClusterSettings``, ``CbsExperiment``: types, literals as enums, ranges as
minimums, patterns, defaults, the fields without one as required, and the field docstrings as
descriptions), so that nothing restates them by hand.

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
from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.declared import json_schema, required
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

__all__ = ["SECTIONS", "Section", "check", "docs_table", "render", "schema_properties"]

REPO = Path(__file__).resolve().parents[3]
SCHEMA = Path("workflow/schemas/config.schema.yaml")
DOCS = Path("docs/workflow.md")


@dataclass(frozen=True)
class Section:
    """One settings section of an analysis: its key, its class, None's spelling per field and the
    keys the section has beside the class's fields (the workflow's own switches)."""

    key: str
    cls: type
    spelled: dict[str, str]
    extra: dict[str, dict[str, Any]]
    prefix: str = "analyses.<name>."
    """What the docs table writes before the section's key (the configuration's path to it)."""
    docs: Path = DOCS
    """The page of its table."""
    entry: bool = False
    """An entry of a mapping keyed by name (a whole object: its required keys, no others), rather than
    a section's properties."""

    def properties(self) -> dict[str, dict[str, Any]]:
        return {**self.extra, **json_schema(self.cls, self.spelled)}

    def schema(self) -> dict[str, Any]:
        """What the schema holds between the markers: the properties, or an entry's whole object."""
        if not self.entry:
            return self.properties()
        needed = {"required": required(self.cls)} if required(self.cls) else {}
        return {"type": "object", "additionalProperties": False, **needed, "properties": self.properties()}


SECTIONS = (
    Section("settings", AnalysisSettings, {"noise_samples": "all"}, {}),
    Section(
        "spectrum",
        SpectrumSettings,
        {},
        {"enabled": {"type": "boolean", "default": False, "description": "Measure Hessian spectra per (state, case)."}},
    ),
    Section("cluster", ClusterSettings, {}, {}, prefix=""),
    Section("cbs", CbsExperiment, {}, {}, prefix="", docs=Path("docs/critical-batch.md"), entry=True),
)


def _markers(section: Section, comment: str) -> tuple[str, str]:
    name = section.cls.__name__
    begin, end = (
        f"BEGIN generated from {name} (python -m tiny_llm.campaign.settings_reference --write)",
        f"END generated from {name}",
    )
    return (f"# {begin}", f"# {end}") if comment == "#" else (f"<!-- {begin} -->", f"<!-- {end} -->")


def schema_properties(section: Section, indent: int) -> str:
    """The section's properties as YAML lines at ``indent`` spaces."""
    text = yaml.safe_dump(section.schema(), sort_keys=False, allow_unicode=True, width=110)
    return "".join(" " * indent + line + "\n" for line in text.splitlines())


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
    for key, schema in section.properties().items():
        spelled = section.spelled.get(key)
        if "default" not in schema:
            cell = "(required)"
        else:
            default = None if spelled is not None and schema["default"] == spelled else schema["default"]
            cell = _cell(default, spelled)
        meaning = schema.get("description", "").replace("|", "\\|")
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
    for section in SECTIONS:
        if path == SCHEMA:
            begin, end = _markers(section, "#")
            indent = len(text.split(begin, 1)[0].rsplit("\n", 1)[-1])
            text = _replace(text, begin, end, schema_properties(section, indent), path)
        elif path == section.docs:
            begin, end = _markers(section, "<!--")
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
