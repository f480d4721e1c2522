"""`make cbs-demo` (or the full study) timed in a fresh folder, and the tables of
docs/critical-batch.md written from what it produces: each experiment's cbs.csv, rates.csv,
branches.csv and fits.csv are copied to docs/results/<name>/ and the page's block of tables for it
rewritten from them (tests/unit/test_docs.py holds the page to those files).

    .venv/bin/python benchmarks/cbs_demo.py                       # the demo in a temporary folder
    .venv/bin/python benchmarks/cbs_demo.py --keep /tmp/cbs-demo --write
    .venv/bin/python benchmarks/cbs_demo.py --config config/cbs-study.yaml --cores 2 --write
    .venv/bin/python benchmarks/cbs_demo.py --config config/cbs-study.yaml --done /tmp/study --write
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from tiny_llm.results.cbs_page import experiment_tables, replace_tables  # noqa: E402

PAGE = REPO / "docs/critical-batch.md"
KEPT = ("cbs", "rates", "branches", "fits")
"""The tables copied into docs/results/<name>/ (curves.csv stays with the run: it is the largest)."""


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def run(config: str, root: Path, cores: int) -> float:
    """The workflow on ``config`` in ``root`` (a fresh copy of the workflow): its seconds."""
    root.mkdir(parents=True, exist_ok=True)
    for part in ("Snakefile", "workflow", "profiles", "config", "envs"):
        source = REPO / part
        if not (root / part).exists():
            (shutil.copytree if source.is_dir() else shutil.copy)(source, root / part)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["snakemake", f"-c{cores}", "--configfile", config, "--replace-workflow-config"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit((done.stdout + done.stderr)[-3000:])
    return time.perf_counter() - started


def write(root: Path, names: list[str]) -> None:
    """Each experiment's tables into docs/results/<name>/ and its block of the page rewritten."""
    page = PAGE.read_text()
    for name in names:
        folder = REPO / "docs/results" / name
        folder.mkdir(parents=True, exist_ok=True)
        for table in KEPT:
            shutil.copy(root / "results" / name / f"{table}.csv", folder / f"{table}.csv")
        shutil.copy(root / "results" / name / "figures/critical_batch.png", REPO / f"docs/figures/{name}.png")
        page = replace_tables(page, name, experiment_tables(_rows(folder / "cbs.csv"), _rows(folder / "rates.csv")))
    PAGE.write_text(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/cbs-demo.yaml", help="the workflow configuration to run")
    parser.add_argument("--keep", type=Path, help="run it here and keep the folder")
    parser.add_argument("--done", type=Path, help="a folder where it already ran: only read its results")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="copy the tables to docs/results and rewrite the page")
    args = parser.parse_args()
    names = list(yaml.safe_load((REPO / args.config).read_text())["cbs_experiments"])
    root = args.done or args.keep or Path(tempfile.mkdtemp(prefix="cbs-"))
    if not args.done:
        seconds = run(args.config, root, args.cores)
        print(f"{args.config}: {seconds:.0f} s on {args.cores} of {os.cpu_count()} cores, in {root}")
    for name in names:
        results = root / "results" / name
        print(f"\n{name}\n" + experiment_tables(_rows(results / "cbs.csv"), _rows(results / "rates.csv")))
    if args.write:
        write(root, names)
        print(f"\nwrote docs/results/{{{','.join(names)}}}/ and their tables in {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
