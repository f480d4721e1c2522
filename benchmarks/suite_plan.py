"""How long a suite-sized study takes to plan, and how many cluster jobs it asks for.

A PolyPythia-sized miniature, made here without download: ``--seeds`` repositories of Pythia's 154
revision names (step0, 1, 2, 4 … 512, 1000 … 143000) in a local Hugging Face cache (tiny GPT-NeoX
weights), their published training order as a Megatron indexed dataset (one sequence per step),
and one analysis per seed measuring seen, unseen and recent on windows of two steps (step0 and
step1 left out, with a note: they have not trained two steps). The dry run of the NAISS
profile (``snakemake -n``) is timed, with a GH200 timing entry whose per-state work is a few
minutes, and its cost lines (jobs, states per job, GPU-hours) are printed.

    .venv/bin/python benchmarks/suite_plan.py            # 4 seeds x 154 revisions x 3 cases
    .venv/bin/python benchmarks/suite_plan.py --seeds 1 --keep /tmp/suite
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
PYTHIA_STEPS = (0, *(2**k for k in range(10)), *range(1000, 143_001, 1000))
SECONDS = {"startup": 60.0, "gradient_microbatch": 0.05, "hvp_microbatch_pass": 2.0}


def make_suite(root: Path, seeds: int) -> None:
    import torch
    import transformers
    from hf_hub import RUN_YAML, cache_revision, neox_config

    from tiny_llm.data.training_order import write_megatron

    sequences = np.random.default_rng(0).integers(0, 64, size=(PYTHIA_STEPS[-1] + 4, 9)).astype(np.uint16)
    write_megatron(root / "document", sequences)
    (root / "run.yaml").write_text(RUN_YAML.replace("cache/p", "cache/suite"))
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = transformers.GPTNeoXForCausalLM(neox_config(num_hidden_layers=1))
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        for step in PYTHIA_STEPS:
            with torch.no_grad():
                for k, p in model.named_parameters():
                    p.copy_(start[k] * (1 + 1e-6 * step))
            folder = root / "saved" / f"seed{seed}-step{step}"
            model.save_pretrained(folder, safe_serialization=True)
            cache_revision(root / "hf", f"org/seed{seed}", f"step{step}", folder)


def configure(root: Path, seeds: int) -> None:
    import yaml

    from tiny_llm.campaign.timing import timing_key
    from tiny_llm.campaign.workflow import WorkflowPlan

    analyses = {
        f"seed{seed}": {
            "config": "run.yaml",
            "hf_checkpoints": {"repo": f"org/seed{seed}", "revisions": "all"},  # step0, 1 left out: seen needs 2
            "tokens_per_step": 8,
            "training_order": {"path": "document", "format": "megatron", "sequences_per_step": 1},
            "case_steps": 2,  # two noise batches of one sequence
            "cases": ["seen", "unseen", "recent"],
            "settings": {"noise_samples": 2, "random_samples": 2},
        }
        for seed in range(seeds)
    }
    gpu = {"device": "cuda", "dtype": "float32", "tf32": True, "compile_hvp": True, "engine": "auto"}
    config = {"analyses": analyses, "settings_override": gpu, "cluster": {"timing_profiles": ["timing.json"]}}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    os.chdir(root)
    planned = WorkflowPlan({**config, "cluster": {"walltime": "estimate"}}).campaign.analyses["seed0"]
    key = timing_key(planned.run, planned.settings, "cuda:NVIDIA GH200 480GB")
    (root / "timing.json").write_text(json.dumps({"entries": [{"key": key, "seconds": SECONDS}]}))


def without_absent_controller(root: Path) -> dict[str, str]:
    """The environment of the dry run. The Slurm plugin asks ``scontrol show config`` at start-up
    and waits up to 10 s for a controller; on a machine with Slurm's client but no controller the
    plan would time that wait, so a stand-in ``scontrol`` that fails at once (as on a machine
    without Slurm; a cluster's login node answers in milliseconds) goes first on the PATH."""
    env = dict(os.environ)
    if shutil.which("scontrol") and subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode:
        stand_in = root / "no-controller"
        stand_in.mkdir(exist_ok=True)
        (stand_in / "scontrol").write_text("#!/bin/sh\nexit 1\n")
        (stand_in / "scontrol").chmod(0o755)
        env["PATH"] = f"{stand_in}{os.pathsep}{env['PATH']}"
        print("no Slurm controller answers here: scontrol stands in, failing at once")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="build the suite here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="suite-plan-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["HF_HUB_CACHE"] = str(root / "hf")
    started = time.perf_counter()
    if not (root / "hf").exists():
        make_suite(root, args.seeds)
    print(f"built {args.seeds} x {len(PYTHIA_STEPS)} revisions in {time.perf_counter() - started:.0f} s")
    configure(root, args.seeds)
    snakemake = Path(sys.executable).with_name("snakemake")
    command = [str(snakemake), "--snakefile", str(REPO / "Snakefile"), "--configfile", "config.yaml"]
    command += ["--profile", str(REPO / "profiles/naiss"), "-n", "--quiet", "rules"]
    started = time.perf_counter()
    plan = subprocess.run(command, capture_output=True, text=True, cwd=root, env=without_absent_controller(root))
    seconds = time.perf_counter() - started
    text = plan.stdout + plan.stderr
    if plan.returncode:
        sys.exit(text[-3000:])
    print(f"snakemake -n: {seconds:.1f} s wall")
    for line in text.splitlines():
        if line.startswith(("analysis ", "campaign on Slurm")):
            print(line[:400])


if __name__ == "__main__":
    main()
