#!/usr/bin/env bash
# One prepared GPU check (`make gpu-check`), about 8 minutes on one H200 or GH200. It runs:
#   1. the CUDA tests (compiled Pearlmutter, TF32, bf16 autocast against CPU float64) and the slow
#      torch.compile test;
#   2. benchmarks/hvp_cost.py --device cuda, eager and compiled, every engine, both models;
#   3. benchmarks/precision.py --device cuda (float32, TF32, bf16 autocast, bf16 Lanczos basis);
#   4. walltime calibration of the demo shape and of config/runs/20m.yaml (context 1024, curvature
#      batch 64, bf16 autocast + TF32 as on the cluster), as timing entries for config/timing.yaml;
# and writes benchmarks/out/gpu-check/report.{json,md} with every step's status, time and numbers.
# Each step has its own time limit and a failed step does not stop the others; the exit status
# is non-zero when any step failed. Without a CUDA device it stops at once and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=benchmarks/out/gpu-check
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: no CUDA device is visible to $PY (torch.cuda.is_available() is False);" \
         "run it on a GPU node, e.g. inside an interactive Slurm job" >&2
    exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT"
export TINY_LLM_GPU_CHECK_OUT="$OUT"
failed=0

step() {  # step NAME LIMIT_SECONDS COMMAND...: run, log to $OUT/NAME.log, record status and seconds
    local name=$1 limit=$2; shift 2
    local start=$SECONDS status=ok
    echo "gpu-check: $name (at most ${limit} s) ..." >&2
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || { status="failed (exit $?)"; failed=1; }
    echo "{\"step\": \"$name\", \"status\": \"$status\", \"seconds\": $((SECONDS - start))}" >>"$OUT/steps.jsonl"
    echo "gpu-check: $name: $status in $((SECONDS - start)) s" >&2
}

step cuda-tests 150 "$PY" -m pytest -q -rs -m "" -p no:cacheprovider \
    tests/unit/workers/test_state.py tests/unit/curvature/test_hessian.py -k "cuda or compiled"
step hvp-cost-eager 90 "$PY" benchmarks/hvp_cost.py --device cuda --dtype float32 --trials 3 \
    --out "$OUT/hvp-cost-eager.json"
step hvp-cost-compiled 120 "$PY" benchmarks/hvp_cost.py --device cuda --dtype float32 --compile --trials 3 \
    --engines pearlmutter --out "$OUT/hvp-cost-compiled.json"
step precision 90 "$PY" benchmarks/precision.py --device cuda --samples 8
step calibrate 90 "$PY" - <<'EOF'
import json, os, torch, yaml
from pathlib import Path
from tiny_llm.workers.state import AnalysisSettings
from tiny_llm.config import load_config
from tiny_llm.campaign.timing import calibrate

out = Path(os.environ["TINY_LLM_GPU_CHECK_OUT"])
entries = []
for run, hvp in (("config/runs/demo.yaml", 8), ("config/runs/20m.yaml", 64)):
    config = load_config(run)
    for batch, K in ((hvp, 16), (hvp // 2, 16), (hvp // 4, 8)):
        settings = AnalysisSettings(device="cuda", dtype="float32", amp=True, tf32=True, hvp_batch_size=batch,
                                    directions_per_pass=K)
        try:
            entry = calibrate(config, settings)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            print(f"{run}: out of memory at curvature batch {batch}, K = {K}; trying smaller", flush=True)
            continue
        entry["run_config"] = run
        entries.append(entry)
        print(f"{run}: {entry['seconds']}", flush=True)
        break
(out / "timing-entries.yaml").write_text(yaml.safe_dump({"entries": entries}, sort_keys=False))
EOF
"$PY" - <<'EOF'
import json, os, platform, subprocess, torch
from pathlib import Path

out = Path(os.environ["TINY_LLM_GPU_CHECK_OUT"])
steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
          "machine": platform.machine(), "steps": steps}
for name in ("hvp-cost-eager", "hvp-cost-compiled"):
    path = out / f"{name}.json"
    report[name] = json.loads(path.read_text()) if path.exists() else None
precision = sorted(Path("benchmarks/out").glob("precision-*.md"), key=lambda p: p.stat().st_mtime)
timing = out / "timing-entries.yaml"
lines = [f"# GPU check: {report['device']} (torch {report['torch']}, CUDA {report['cuda']}, {report['machine']})", "",
         "| step | status | seconds |", "| --- | --- | --- |",
         *[f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in steps], ""]
tests = (out / "cuda-tests.log").read_text().strip().splitlines()[-3:] if (out / "cuda-tests.log").exists() else []
lines += ["## CUDA tests", "", "```", *tests, "```", ""]
for name in ("hvp-cost-eager", "hvp-cost-compiled"):
    log = (out / f"{name}.log").read_text() if (out / f"{name}.log").exists() else ""
    lines += [f"## {name}", "", "```", *log.strip().splitlines()[-30:], "```", ""]
if precision:
    lines += ["## Precision against float64", "", precision[-1].read_text(), ""]
    report["precision"] = precision[-1].read_text()
if timing.exists():
    lines += ["## Timing entries (copy into config/timing.yaml)", "", "```yaml", timing.read_text(), "```"]
    report["timing_entries"] = timing.read_text()
(out / "report.json").write_text(json.dumps(report, indent=1))
(out / "report.md").write_text("\n".join(lines) + "\n")
print(f"gpu-check: report in {out}/report.md")
EOF
exit $failed
