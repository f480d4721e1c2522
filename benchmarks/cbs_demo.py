"""`make cbs-demo` timed in a fresh folder, and the table of docs/critical-batch.md regenerated from
what it produces (the script says whether the page holds the same table).

    .venv/bin/python benchmarks/cbs_demo.py            # a temporary folder
    .venv/bin/python benchmarks/cbs_demo.py --keep /tmp/cbs-demo
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = (
    "| checkpoint (tokens) | B\\* (Merrill, ε = {epsilon}) | its interval | B_crit (fit) | its interval "
    "| B\\* that B_noise predicts | B_simple | B_noise |\n| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |"
)


def _number(text: str) -> str:
    value = float(text)
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _interval(low: str, high: str) -> str:
    return f"[{_number(low) if low else '?'}, {_number(high) if high else '∞'})"


def demo_table(rows: list[dict[str, str]], epsilon: float) -> str:
    """The docs' table of ``cbs.csv``'s rows (sizes in sequences)."""
    lines = [HEADER.format(epsilon=f"{epsilon:g}")]
    for row in rows:
        epoch = int(row["checkpoint"].removeprefix("epoch-"))
        crit = "" if not row["b_crit"] else _number(row["b_crit"])
        crit_interval = "" if not row["b_crit"] else f"[{_number(row['b_crit_low'])}, {_number(row['b_crit_high'])}]"
        predicted = "" if not row["b_noise_cbs"] else f"{_number(row['b_noise_cbs'])} (grid: {row['b_noise_cbs_grid']})"
        scales = [
            "" if not row[name] else f"{_number(row[name])} ± {_number(row[name + '_se'] or 'nan')}"
            for name in ("b_simple", "b_noise")
        ]
        lines.append(
            f"| epoch {epoch} ({int(row['tokens']):,}) | {row['cbs']} | {_interval(row['cbs_low'], row['cbs_high'])} "
            f"| {crit} | {crit_interval} | {predicted} | {scales[0]} | {scales[1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="run it here and keep the folder")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="cbs-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    for part in ("Snakefile", "workflow", "profiles", "config", "envs"):
        source = REPO / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / part)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["snakemake", "-c2", "--configfile", "config/cbs-demo.yaml", "--replace-workflow-config"]
    started = time.perf_counter()
    run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if run.returncode:
        sys.exit((run.stdout + run.stderr)[-3000:])
    print(f"make cbs-demo: {seconds:.0f} s on {os.cpu_count()} cores")
    with open(root / "results/cbs-demo/cbs.csv") as handle:
        rows = list(csv.DictReader(handle))
    import yaml

    epsilon = yaml.safe_load((root / "config/cbs-demo.yaml").read_text())["cbs_experiments"]["cbs-demo"]["epsilon"]
    table = demo_table(rows, epsilon)
    print(table)
    page = (REPO / "docs/critical-batch.md").read_text()
    print("docs/critical-batch.md holds this table" if table in page else "docs/critical-batch.md differs: paste it")


if __name__ == "__main__":
    main()
