"""The documentation says what the code does: every documented default equals the code's, the
report captions are the reading guide's, and the docs stand on their own."""

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_llm.cli import _parser as build_parser
from tiny_llm.layout import AUDIT_FIGURES, FIGURES, SPECTRUM_FIGURES
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.spectrum import SpectrumSettings

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = (REPO / "docs/workflow.md").read_text()
CLI = (REPO / "docs/cli.md").read_text()
CROSS_SEED = (REPO / "docs/cross-seed.md").read_text()
GUIDE = (REPO / "docs/reading-results.md").read_text()
SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
ANALYSIS = SCHEMA["properties"]["analyses"]["additionalProperties"]["properties"]


def _value(text: str):
    """A documented default as data: `all` and null are None (all samples / unset), the rest YAML."""
    text = text.strip().strip("`")
    if text in ("all", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return yaml.safe_load(text)


def _table_defaults() -> dict[str, object]:
    """{key: default} from the table of configuration keys (docs/workflow.md; multi-key rows expanded)."""
    section = WORKFLOW.split("## Configuration keys", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        key, default = cells[0].strip("`"), cells[1]
        if default in ("", "(required)"):
            continue
        group = re.fullmatch(r"(.*)\.\{(.*)\}", key)
        if group:
            names = [n.strip() for n in group.group(2).split(",")]
            values = [v.strip() for v in default.split(",")]
            assert len(names) == len(values), line
            rows.update({f"{group.group(1)}.{n}": _value(v) for n, v in zip(names, values, strict=True)})
        else:
            rows[key] = _value(default)
    return rows


def _schema_default(key: str):
    parts = key.split(".")
    if parts[0] == "analyses":
        node = ANALYSIS
        if parts[2] in ("settings", "spectrum"):
            node = ANALYSIS[parts[2]]["properties"]
        value = node[parts[-1]]["default"]
    elif parts[0] in ("train_runs", "seed_experiments", "seed_comparisons"):
        value = SCHEMA["properties"][parts[0]]["additionalProperties"]["properties"][parts[-1]]["default"]
    else:
        node = SCHEMA["properties"][parts[0]]
        value = node["properties"][parts[1]]["default"] if len(parts) > 1 else node["default"]
    return None if value == "all" else value


def test_the_table_of_keys_states_the_schema_defaults():
    rows = _table_defaults()
    assert len(rows) > 20  # the settings, spectrum and cluster tables are generated from their dataclasses
    for key, documented in rows.items():
        assert documented == _schema_default(key), key


@pytest.mark.parametrize("name, cls", [("settings", AnalysisSettings), ("spectrum", SpectrumSettings)])
def test_schema_defaults_are_the_code_defaults(name, cls):
    schema = ANALYSIS[name]["properties"]
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(schema) - {"enabled"} == set(fields)
    for key, default in fields.items():
        assert (None if schema[key]["default"] == "all" else schema[key]["default"]) == default, key


def test_config_comments_state_the_spectrum_defaults():
    """config/config.yaml shows the default of each spectral setting in brackets."""
    text = (REPO / "config/config.yaml").read_text()
    defaults = {f.name: f.default for f in dataclasses.fields(SpectrumSettings)}
    found = 0
    for key, bracket in re.findall(r"^\s+(\w+): .*\[([^\]]+)\]\s*$", text, re.M):
        if key in defaults:
            assert _value(bracket) == defaults[key], key
            found += 1
    assert found >= 8


def test_cli_defaults_are_the_code_defaults_and_every_subcommand_is_described():
    from tiny_llm.curvature.engines import names

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    engine = next(a for a in subparsers.choices["analyze-state"]._actions if a.dest == "engine")
    assert tuple(engine.choices) == ("auto", *names())  # the registry's engines
    # the parser, its settings and the registry import no torch (--help stays fast)
    probe = "import sys, tiny_llm.cli as c; c._parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"
    settings = {f.name: f.default for f in dataclasses.fields(AnalysisSettings)}
    spectrum = {f.name: f.default for f in dataclasses.fields(SpectrumSettings)}
    for name, sub in subparsers.choices.items():
        assert sub.description, f"tiny-llm {name} has no description"
        for action in sub._actions if name.startswith("analyze") else []:
            dest = action.dest
            if dest in settings and action.default is not None and not isinstance(action.default, bool):
                assert action.default == settings[dest], (name, dest)
            if dest in spectrum and action.default is not None:
                assert action.default == spectrum[dest], (name, dest)


def test_documented_option_defaults_of_analyze_state_match_the_code():
    settings = AnalysisSettings()
    found = re.findall(r"`--([a-z-]+) (\d+)[|`]", CLI)
    assert len(found) >= 3
    for option, default in found:
        field = option.replace("-", "_")
        if hasattr(settings, field):
            assert int(default) == getattr(settings, field), option


def test_report_captions_are_the_reading_guides_figure_texts():
    """Each figure's report caption is the first paragraph of its section in docs/reading-results.md."""
    for figure in FIGURES + AUDIT_FIGURES + SPECTRUM_FIGURES:
        match = re.search(rf"^### `{figure}`\n\n(.+?)\n\n", GUIDE, re.M | re.S)
        assert match, f"docs/reading-results.md has no section for {figure}"
        caption = (REPO / "workflow/report/figures" / f"{figure}.rst").read_text()
        assert " ".join(caption.split()) == " ".join(match.group(1).split()), (
            f"workflow/report/figures/{figure}.rst differs from its paragraph in docs/reading-results.md; copy it"
        )


def test_docs_stand_on_their_own():
    """No reference to documents a user of the repository does not have."""
    texts = {
        path: path.read_text()
        for path in [
            REPO / "README.md",
            REPO / "benchmarks/README.md",
            *REPO.glob("docs/*.md"),
            *REPO.glob("src/tiny_llm/**/*.py"),
        ]
    }
    for path, text in texts.items():
        for phrase in ("DESIGN.md", "seed reference", "reference document", "the issue", "STYLE.md"):
            assert phrase not in text, f"{path.relative_to(REPO)} mentions {phrase!r}"


def test_the_docs_state_the_geometry_settings_defaults():
    from tiny_llm.geometry.settings import GeometrySettings

    paragraph = CROSS_SEED.split("**Settings** (`seed_experiments.<name>.settings`", 1)[1].split("(a\nprofile's", 1)[0]
    documented = {key: _value(value) for key, value in re.findall(r"`(\w+)` ([\w.]+)", paragraph)}
    defaults = {f.name: f.default for f in dataclasses.fields(GeometrySettings)}
    assert documented == defaults


def test_every_link_of_the_docs_leads_somewhere():
    """Relative links of the README and the docs pages name files that exist (and headings that exist)."""
    pages = [REPO / "README.md", *REPO.glob("docs/*.md")]
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{page.relative_to(REPO)} links to {target}: no such heading"
            checked += 1
    assert checked >= 15


def test_the_front_door_and_the_workflow_files_stay_small():
    """The README is a front door, common.smk holds checks and thin input functions, rule files are short."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
    assert len((REPO / "workflow/rules/common.smk").read_text().splitlines()) <= 300
    for rules in (REPO / "workflow/rules").glob("*.smk"):
        if rules.name != "common.smk":
            assert len(rules.read_text().splitlines()) <= 150, rules.name


def test_the_critical_batch_tables_are_what_the_runs_wrote():
    """Every block of tables in docs/critical-batch.md is written from the committed results of its
    run (docs/results/<name>/, by benchmarks/cbs_demo.py --write), and every committed run has one."""
    import csv

    from tiny_llm.results.cbs_page import experiment_tables, table_blocks

    def rows(path):
        with open(path) as handle:
            return list(csv.DictReader(handle))

    blocks = table_blocks((REPO / "docs/critical-batch.md").read_text())
    committed = sorted(p.name for p in (REPO / "docs/results").iterdir() if (p / "cbs.csv").exists())
    assert sorted(blocks) == committed and committed
    for name in committed:
        folder = REPO / "docs/results" / name
        assert blocks[name] == experiment_tables(rows(folder / "cbs.csv"), rows(folder / "rates.csv")), name


def test_the_reading_guides_demo_tables_are_what_the_run_wrote():
    """The demo's tables in docs/reading-results.md are written from docs/results/demo/ (by
    benchmarks/guide_tables.py --write): the page holds exactly what those rows give."""
    import csv

    from tiny_llm.results.cbs_page import table_blocks
    from tiny_llm.results.guide_tables import GUIDE_TABLES

    def rows(name):
        with open(REPO / "docs/results/demo" / name) as handle:
            return list(csv.DictReader(handle))

    blocks = table_blocks(GUIDE)
    inputs = rows("summary.csv"), rows("spectrum-applied.csv"), rows("spectrum-next.csv")
    assert sorted(blocks) == sorted(GUIDE_TABLES)
    for name, table in GUIDE_TABLES.items():
        assert blocks[name] == table(*inputs), name
