"""The demo's tables of docs/reading-results.md written from a run: `make demo` with spectra (the
seen case, which the tables read) in a fresh folder, then each checkpoint's spectrum again with
Adam's P of the next step (tiny-llm analyze-spectrum --preconditioner next); the rows the tables
read are copied to docs/results/demo/ and the page's blocks rewritten from them
(tests/unit/test_docs.py holds the page to those files).

    .venv/bin/python benchmarks/guide_tables.py --keep /tmp/guide --write
    .venv/bin/python benchmarks/guide_tables.py --done /tmp/guide --write
"""

from __future__ import annotations

import argparse
import csv
import json
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
from tiny_llm.results.cbs_page import replace_tables  # noqa: E402
from tiny_llm.results.guide_tables import GUIDE_TABLES  # noqa: E402

PAGE = REPO / "docs/reading-results.md"
SNAPSHOT = REPO / "docs/results/demo"
SUMMARY = (
    "file", "case", "step", "tokens", "loss", "normalized_alignment", "random_curvature", "random_curvature_se",
    "grad_curvature", "b_simple", "b_noise", "step_grad_dot", "step_sharpness", "optimal_step",
    "predicted_loss_change", "actual_loss_change", "precond_b_simple", "precond_b_noise", "precond_gradient_step",
)  # fmt: skip
SPECTRUM = ("file", "case", "lr", "stability_threshold", "precond_la_eigenvalue_1")


def _rows(path: Path, columns: tuple[str, ...] | None = None) -> list[dict[str, str]]:
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    return rows if columns is None else [{k: r.get(k, "") for k in columns} for r in rows]


def _write(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def run(root: Path, preconditioner: str) -> float:
    """The demo with spectra (P ``preconditioner``) in ``root``: its seconds."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["analyses"]["demo"]["spectrum"] |= {"enabled": True, "preconditioner": preconditioner}
    config["analyses"]["demo"]["cases"] = ["seen"]  # the tables read the seen case
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config/guide.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["snakemake", "-c2", "--configfile", "config/guide.yaml", "--replace-workflow-config"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit((done.stdout + done.stderr)[-3000:])
    return time.perf_counter() - started


def next_spectra(root: Path) -> None:
    """The seen case's spectra of the demo's checkpoints after the first with Adam's P of the next
    step (``tiny-llm analyze-spectrum --preconditioner next``), as spectrum.csv rows in
    ``root/spectrum-next.csv``: the analysis's own spectra keep the applied P (its results are
    bound to their settings)."""
    from tiny_llm.results.spectrum_table import _preconditioned_spectrum

    rows, tiny_llm = [], Path(sys.executable).with_name("tiny-llm")
    for weights in sorted((root / "runs/demo").glob("epoch-*.safetensors"))[1:]:
        output = root / "spectra-next" / f"{weights.stem}.json"
        command = [str(tiny_llm), "analyze-spectrum", "--run", "runs/demo", "--checkpoint", weights.name]
        command += ["--case", "seen", "--output", str(output), "--device", "cpu", "--dtype", "float64"]
        command += ["--preconditioner", "next"]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True)
        if done.returncode:
            sys.exit((done.stdout + done.stderr)[-3000:])
        result = json.loads(output.read_text())
        rows.append({"file": weights.name, "case": "seen", **_preconditioned_spectrum(result)})
    _write(root / "spectrum-next.csv", [{k: r.get(k, "") for k in SPECTRUM} for r in rows], SPECTRUM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="run it here and keep the folder")
    parser.add_argument("--done", type=Path, help="a folder where it already ran: only read its results")
    parser.add_argument("--write", action="store_true", help="copy the rows to docs/results/demo, rewrite the page")
    args = parser.parse_args()
    root = args.done or args.keep or Path(tempfile.mkdtemp(prefix="guide-"))
    if not args.done:
        root.mkdir(parents=True, exist_ok=True)
        for part in ("Snakefile", "workflow", "profiles", "config", "envs"):
            source = REPO / part
            if source.is_dir():
                shutil.copytree(source, root / part, dirs_exist_ok=True)
            else:
                shutil.copy(source, root / part)
        seconds = run(root, "applied")
        shutil.copy(root / "results/demo/spectrum.csv", root / "spectrum-applied.csv")
        started = time.perf_counter()
        next_spectra(root)
        seconds += time.perf_counter() - started
        print(f"the demo with spectra, P applied and P of the next step: {seconds:.0f} s, in {root}")
    summary = _rows(root / "results/demo/summary.csv", SUMMARY)
    applied, following = (_rows(root / f"spectrum-{kind}.csv", SPECTRUM) for kind in ("applied", "next"))
    for name, table in GUIDE_TABLES.items():
        print(f"\n{name}\n{table(summary, applied, following)}")
    if args.write:
        SNAPSHOT.mkdir(parents=True, exist_ok=True)
        _write(SNAPSHOT / "summary.csv", summary, SUMMARY)
        for kind, rows in (("applied", applied), ("next", following)):
            _write(SNAPSHOT / f"spectrum-{kind}.csv", rows, SPECTRUM)
        page = PAGE.read_text()
        for name, table in GUIDE_TABLES.items():
            page = replace_tables(page, name, table(summary, applied, following))
        PAGE.write_text(page)
        print(f"\nwrote {SNAPSHOT.relative_to(REPO)} and the tables of {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
