#!/usr/bin/env bash
# One prepared GPU check (`make gpu-check`), at most 9 minutes in all on one H200 or GH200, first
# compilations included. In order of what only a GPU can tell:
#   1. the CUDA tests (adjoint forms and compiled Pearlmutter, TF32, bf16 autocast, against CPU
#      float64);
#   2. the memory model against torch.cuda.max_memory_allocated at the 20M model's shape, and one
#      campaign micro-batch cut for a budget (benchmarks/memory.py --device cuda);
#   3. walltime calibration at the campaign's settings (config/naiss.yaml: curvature micro-batch 64,
#      K = 16, bf16 autocast + TF32, the memory budget's grouping) and of the demo shape, as timing
#      entries for config/timing.yaml keyed by this GPU;
#   4. benchmarks/hvp_cost.py --device cuda at the 20M shape, eager (memory is step 2's);
#   5. benchmarks/precision.py --device cuda at the demo's final checkpoint (float32, TF32, bf16
#      autocast, bf16 Lanczos basis);
#   6. benchmarks/real_shapes.py --device cuda: the quadratic-form table at GPT-2 small's and
#      Pythia-160M's widths and vocabularies (and the 0.8M shape) beside the peers installed there,
#      each against float64, over one 256-token sequence;
#   7. the same table at GPT-2 small over a campaign job's context, 16 sequences of 1,024 tokens (a
#      quarter of a campaign micro-batch, compute-bound already: 64 sequences take four times as
#      long and do not fit the 9 minutes), in groups of 8, the head 4,096 positions at a time;
# Each step's limit is its time on the first H200 run (a fresh machine, first compilations
# included) with a margin, and a step whose limit no longer fits in the time left is left out by
# name rather than cut short. Left out by name, because they do not fit the 9 minutes (run them with
# GPU_CHECK_FULL=1 GPU_CHECK_SECONDS=1200): the compiled rows (real_shapes.py --compile and
# hvp_cost.py --compile: about two minutes of first compilation each), and precision.py's initial
# and middle checkpoints and 0.8M model. The demo and 0.8M shapes of hvp_cost.py and real_shapes.py
# are CPU-sized (launch-bound on a GPU) and not run here.
# GPU_CHECK_STEPS (space-separated step names) runs only those, the others left out by name, e.g.
# GPU_CHECK_STEPS="hvp-cost-eager precision" to run two steps again. The report,
# benchmarks/out/gpu-check/report.{json,md}, is written after every step that ran and at the end,
# so a check cut short still leaves the report of what ran. Each step's output goes to its log as it comes.
#
# PYTHON names the interpreter (default .venv/bin/python). Any Python with a CUDA build of torch,
# pytest, pyyaml and pandas will do, as it is: the source comes from src/ on PYTHONPATH, nothing is
# installed and no network is needed (snakemake is not used). GPU_CHECK_SECONDS (default 540) is
# the time for all steps together; a step that would start after it is skipped. A failed step does
# not stop the others; the exit status is non-zero when any step failed. Without a CUDA device it
# stops at once, with exit status 2, and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=benchmarks/out/gpu-check
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "gpu-check: $PY cannot import torch; set PYTHON to an interpreter with a CUDA build of torch" >&2
    exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: no CUDA device is visible to $PY (torch.cuda.is_available() is False);" \
         "run it on a GPU node, e.g. inside an interactive Slurm job" >&2
    exit 2
fi
rm -rf "$OUT" && mkdir -p "$OUT"
export TINY_LLM_GPU_CHECK_OUT="$OUT"
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-540}))
failed=0

selected() {  # selected NAME: whether GPU_CHECK_STEPS (a space-separated list; empty: all) names the step
    [[ -z ${GPU_CHECK_STEPS:-} || " $GPU_CHECK_STEPS " == *" $1 "* ]]
}

step() {  # step NAME LIMIT_SECONDS COMMAND...: run if selected and its limit fits in the time left
    local name=$1 limit=$2; shift 2
    local start=$SECONDS left=$((DEADLINE - SECONDS))
    if ! selected "$name"; then
        left_out "$name" "not in GPU_CHECK_STEPS"
        return
    elif ((limit > left)); then
        left_out "$name" "needs up to ${limit} s, ${left} s left"
        return
    fi
    local status=ok
    echo "gpu-check: $name (at most ${limit} s) ..." >&2
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || { status="failed (exit $?)"; failed=1; }
    echo "{\"step\": \"$name\", \"status\": \"$status\", \"seconds\": $((SECONDS - start))}" >>"$OUT/steps.jsonl"
    echo "gpu-check: $name: $status in $((SECONDS - start)) s" >&2
    report
}

full() {  # full NAME REASON COMMAND...: a step beyond the 9 minutes: with GPU_CHECK_FULL=1, or named
    local name=$1 reason=$2; shift 2
    if [[ ${GPU_CHECK_FULL:-0} == 1 || " ${GPU_CHECK_STEPS:-} " == *" $name "* ]]; then
        step "$name" 300 "$@"
    else
        left_out "$name" "$reason"
    fi
}

left_out() {  # left_out NAME REASON: a step this check does not run, named in the report
    echo "{\"step\": \"$1\", \"status\": \"left out: $2\", \"seconds\": 0}" >>"$OUT/steps.jsonl"
    echo "gpu-check: $1: left out ($2)" >&2
}

report() {  # benchmarks/out/gpu-check/report.{json,md} from what has run so far
    "$PY" - <<'EOF' >&2
import json, os, platform, subprocess, torch
from pathlib import Path

out = Path(os.environ["TINY_LLM_GPU_CHECK_OUT"])
steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
try:
    device = torch.cuda.get_device_name(0)
except (RuntimeError, AssertionError) as error:  # the report is written whatever the device says
    device = f"unknown ({error})"
report = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
          "machine": platform.machine(), "steps": steps}
for name in ("memory-model", "hvp-cost-eager", "hvp-cost-compiled", "real-shapes", "real-shapes-campaign",
             "real-shapes-compiled"):
    path = out / f"{name}.json"
    report[name] = json.loads(path.read_text()) if path.exists() else None
precision = sorted(Path("benchmarks/out").glob("precision-*.md"), key=lambda p: p.stat().st_mtime)
timing = out / "timing-entries.yaml"
lines = [f"# GPU check: {report['device']} (torch {report['torch']}, CUDA {report['cuda']}, {report['machine']})", "",
         "| step | status | seconds |", "| --- | --- | --- |",
         *[f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in steps], ""]
tests = (out / "cuda-tests.log").read_text().strip().splitlines()[-3:] if (out / "cuda-tests.log").exists() else []
lines += ["## CUDA tests", "", "```", *tests, "```", ""]
for name in ("memory-model", "calibrate", "hvp-cost-eager", "hvp-cost-compiled", "real-shapes",
             "real-shapes-campaign", "real-shapes-compiled"):
    log = (out / f"{name}.log").read_text() if (out / f"{name}.log").exists() else ""
    lines += [f"## {name}", "", "```", *log.strip().splitlines()[-40:], "```", ""]
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
}

# Limits: the H200 runs' seconds (2026-12-04: cuda-tests 96-106, memory-model 31, calibrate 45-46,
# hvp-cost at 20M 22 without its per-engine memory processes, real-shapes 50, the campaign table 55,
# precision's final demo checkpoint 68, its demo trained first) with a margin; together 505 s.
step cuda-tests 120 "$PY" -m pytest -q -rs -m "" -p no:cacheprovider \
    tests/unit/workers/test_state.py tests/unit/curvature/test_hessian.py -k cuda
step memory-model 45 "$PY" benchmarks/memory.py --device cuda --out "$OUT/memory-model.json"
step calibrate 65 "$PY" - <<'EOF'
import os, yaml
from pathlib import Path
from tiny_llm.config import load_config
from tiny_llm.campaign.calibration import calibrate
from tiny_llm.workers.settings import settings_from_dict

out = Path(os.environ["TINY_LLM_GPU_CHECK_OUT"])
campaign = yaml.safe_load(Path("config/naiss.yaml").read_text())["analyses"]["20m-gh200"]["settings"]
entries = []
for run, settings in (("config/runs/20m.yaml", campaign), ("config/runs/demo.yaml", {"hvp_batch_size": 8, "amp": True})):
    settings = settings_from_dict({**settings, "device": "cuda", "dtype": "float32", "tf32": True})
    entry = calibrate(load_config(run), settings)  # a budget that cannot fit is refused by name
    entry["run_config"] = run
    entries.append(entry)
    print(f"{run}: {entry['seconds']}; memory {entry['measured']['memory']}", flush=True)
    (out / "timing-entries.yaml").write_text(yaml.safe_dump({"entries": entries}, sort_keys=False))
EOF
step hvp-cost-eager 45 "$PY" benchmarks/hvp_cost.py --device cuda --dtype float32 --amp --trials 3 --no-memory \
    --models 20m --ks 1,16 --engines taylor,adjoint,pearlmutter --out "$OUT/hvp-cost-eager.json"
step real-shapes 70 "$PY" benchmarks/real_shapes.py --device cuda --trials 2 \
    --shapes gpt2-small,pythia-160m --out "$OUT/real-shapes.json"
step real-shapes-campaign 75 "$PY" benchmarks/real_shapes.py --device cuda --trials 2 --no-peers --no-memory \
    --shapes gpt2-small --sequences 16 --seq-len 1024 --group-rows 8 --head-tokens 4096 \
    --out "$OUT/real-shapes-campaign.json"
step precision 85 "$PY" benchmarks/precision.py --device cuda --models demo --checkpoints final --samples 8
full real-shapes-compiled "about 120 s of first compilation; GPU_CHECK_FULL=1 runs it" \
    "$PY" benchmarks/real_shapes.py --device cuda --compile --no-peers --no-memory \
    --trials 2 --shapes gpt2-small --out "$OUT/real-shapes-compiled.json"
full hvp-cost-compiled "the compiled Pearlmutter product's first compilation at 20M; GPU_CHECK_FULL=1 runs it" \
    "$PY" benchmarks/hvp_cost.py --device cuda --dtype float32 --amp --compile --trials 3 \
    --models 20m --ks 1,16 --engines pearlmutter --out "$OUT/hvp-cost-compiled.json"
full precision-all "the initial and middle checkpoints and the 0.8M model; GPU_CHECK_FULL=1 runs them" \
    "$PY" benchmarks/precision.py --device cuda --samples 8
report  # the steps left out since the last that ran
exit $failed
