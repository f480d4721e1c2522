"""Cost of a quadratic form vᵀHv per direction, relative to one gradient pass (run on demand, not a test).

    .venv/bin/python benchmarks/hvp_cost.py [--device cpu|cuda] [--dtype float32|float64] [--amp]
                                            [--compile] [--models demo,0.8M,20m] [--ks 1,4,16] [--trials 5]

For each model (the demo run's shape, D = 28,832; d_model 128, 4 layers, seq 128, D = 824,448;
and on a GPU ``20m``, the campaign's model at context 1024 over 4 sequences) one process times,
trial after trial, a full-epoch gradient pass (forward + backward over the curvature micro-batches)
immediately followed by one full-epoch pass of each engine with K directions, so that every ratio
pairs two measurements taken under the same machine load; the table reports the median of the
per-trial ratios (time per direction ÷ gradient pass). Peak memory of one pass is measured in a
fresh process per engine (CUDA: allocator peak; CPU: growth of resident memory). Targets: one
direction ≤ 1.5× a gradient; K = 16 ≤ 0.75× per direction on the demo model and ≤ 0.85× on the
0.8M model; peak memory ≤ 2× the gradient pass's.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from tiny_llm.config import ModelConfig, load_config
from tiny_llm.curvature.engines import benchmarked
from tiny_llm.curvature.hessian import EpochHessian, Precision, pad_sequences
from tiny_llm.model.causal import count_parameters, token_losses
from tiny_llm.model.llama import Llama
from tiny_llm.runtime import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]
ENGINES = benchmarked("hvp_cost")  # the registry's engines this benchmark times
TARGET_K16 = {"demo": 0.75, "0.8M": 0.85}


def _model_setup(name: str) -> tuple[ModelConfig, int, int, int]:
    """(model shape, epoch sequences, tokens per sequence, curvature micro-batch)."""
    if name == "demo":
        config = load_config(REPO / "config/runs/demo.yaml")
        return config.model, config.steps_per_epoch * config.training.batch_size, config.data.seq_len, 8
    if name == "0.8M":
        return ModelConfig(vocab_size=256, d_model=128, n_layers=4, n_heads=4, d_ff=344, max_seq_len=128), 32, 128, 8
    if name == "20m":  # the campaign's model at its context; a short epoch (a pass at K = 16 holds GiBs per sequence)
        config = load_config(REPO / "config/runs/20m.yaml")
        return config.model, 4, config.data.seq_len, 2
    raise ValueError(f"--models: expected demo, 0.8M or 20m, got {name!r}")


def _setup(args, name: str):
    shape, n_sequences, seq_len, hvp_batch = _model_setup(name)
    torch.manual_seed(0)
    precision = Precision(torch.device(args.device), getattr(torch, args.dtype), amp=args.amp)
    model = Llama(shape, attention_backend="reference").to(precision.device, precision.dtype)
    tokens = torch.randint(0, shape.vocab_size, (n_sequences, seq_len + 1), generator=torch.Generator().manual_seed(1))
    return precision, model, tokens, hvp_batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gradient_pass(model, batches, n_targets, precision) -> None:
    for inputs, targets in batches:
        loss = token_losses(precision.forward(model, inputs), targets).sum() / n_targets
        loss.backward()
    model.zero_grad(set_to_none=True)


def _seconds(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _operator(args, model, tokens, hvp_batch, precision, engine, K) -> EpochHessian:
    return EpochHessian(
        model,
        tokens,
        batch_size=hvp_batch,
        engine=engine,
        precision=precision,
        directions_per_pass=K,
        compile=args.compile and engine == "pearlmutter",
    )


def _paired_ratios(args, name: str) -> dict:
    precision, model, tokens, hvp_batch = _setup(args, name)
    batches = [(x.to(precision.device), y.to(precision.device)) for x, y in pad_sequences(tokens, hvp_batch)]
    n_targets = tokens[:, 1:].numel()
    gradient = lambda: _gradient_pass(model, batches, n_targets, precision)
    ks = [int(k) for k in args.ks.split(",")]
    cases = {}
    engines = args.engines.split(",")
    for engine in engines:
        for K in ks:
            op = _operator(args, model, tokens, hvp_batch, precision, engine, K)
            V = torch.randn(K, op.flat.D, device=precision.device, dtype=precision.dtype)
            cases[(engine, K)] = (op, V)
            op.quadratic_forms(V)  # warm-up (and compilation)
    gradient()
    ratios = {key: [] for key in cases}
    gradient_seconds = []
    for trial in range(args.trials):
        for (engine, K), (op, V) in cases.items():
            g = _seconds(gradient, precision.device)
            q = _seconds(lambda op=op, V=V: op.quadratic_forms(V), precision.device)
            gradient_seconds.append(g)
            ratios[(engine, K)].append(q / K / g)
        print(f"  {name}: trial {trial + 1}/{args.trials} done", file=sys.stderr, flush=True)
    rows = [
        {"engine": e, "K": K, "per_direction_over_gradient": statistics.median(r), "range": [min(r), max(r)]}
        for (e, K), r in ratios.items()
    ]
    memory = {} if args.no_memory else {"gradient": _peak_memory_mb(args, name, "gradient")}
    for engine in engines if memory else ():
        for K in sorted({min(ks), max(ks)}):
            memory[f"{engine} K={K}"] = _peak_memory_mb(args, name, f"{engine}:{K}")
    return {
        "parameters_D": count_parameters(model),
        "epoch_sequences": len(tokens),
        "seq_len": tokens.size(1) - 1,
        "hvp_batch_size": hvp_batch,
        "gradient_seconds_median": statistics.median(gradient_seconds),
        "rows": rows,
        "peak_memory_mb": memory,
    }


def _peak_memory_mb(args, name: str, what: str) -> float:
    """Peak memory of one pass, measured in a fresh process (CUDA: allocator peak; CPU: RSS growth)."""
    command = [
        sys.executable,
        __file__,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--memory-of",
        f"{name}:{what}",
    ]
    command += ["--amp"] * args.amp + ["--compile"] * args.compile + ["--glibc-defaults"] * args.glibc_defaults
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip())


def _memory_of(args) -> None:
    name, what = args.memory_of.split(":", 1)
    precision, model, tokens, hvp_batch = _setup(args, name)
    batches = [(x.to(precision.device), y.to(precision.device)) for x, y in pad_sequences(tokens, hvp_batch)]
    if what != "gradient":
        engine, K = what.split(":")
        op = _operator(args, model, tokens, hvp_batch, precision, engine, int(K))
        V = torch.randn(int(K), op.flat.D, device=precision.device, dtype=precision.dtype)
    if precision.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(precision.device)
        base = torch.cuda.memory_allocated(precision.device)
    else:
        sampler = _RssSampler()
    if what == "gradient":
        _gradient_pass(model, batches, tokens[:, 1:].numel(), precision)
    else:
        op.quadratic_forms(V)
    peak = (
        torch.cuda.max_memory_allocated(precision.device) - base if precision.device.type == "cuda" else sampler.stop()
    )
    print(peak / 2**20)


class _RssSampler:
    """Peak growth of resident memory over its lifetime, sampled every millisecond from /proc."""

    def __init__(self):
        self.base = self.peak = self._rss()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()

    def _run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return max(self.peak, self._rss()) - self.base


def _target(name: str) -> str:
    """The K = 16 target of a model that has one (the 20M shape on a GPU has none: it is measured)."""
    return f" (≤ {TARGET_K16[name]})" if name in TARGET_K16 else ""


def _print_report(report: dict) -> None:
    print(
        f"{report['device']} {report['dtype']}{' amp' if report['amp'] else ''}"
        f"{' compiled pearlmutter' if report['compile'] else ''}, torch {report['torch']}, "
        f"{report['threads']} threads, {report['trials']} paired trials, allocator: {report['allocator']}"
    )
    for name, model in report["models"].items():
        print(
            f"\n{name}: D = {model['parameters_D']:,}, epoch {model['epoch_sequences']} sequences x "
            f"{model['seq_len']} tokens, curvature micro-batch {model['hvp_batch_size']}, "
            f"gradient pass {model['gradient_seconds_median'] * 1e3:.0f} ms (median)"
        )
        print("| engine | K | per direction ÷ gradient (median) | range |\n| --- | ---: | ---: | --- |")
        for r in model["rows"]:
            print(
                f"| {r['engine']} | {r['K']} | {r['per_direction_over_gradient']:.2f} | "
                f"{r['range'][0]:.2f}–{r['range'][1]:.2f} |"
            )
        memory = model["peak_memory_mb"]
        if memory:
            print("peak memory of one pass (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
        one = [r["per_direction_over_gradient"] for r in model["rows"] if r["K"] == 1]
        k16 = [r["per_direction_over_gradient"] for r in model["rows"] if r["K"] == 16 and r["engine"] == "adjoint"]
        print(
            "targets: "
            + (f"one direction {min(one):.2f} (≤ 1.5); " if one else "")
            + (f"adjoint K=16 {k16[0]:.2f}{_target(name)}; " if k16 else "")
            + ("memory ÷ gradient: " if memory else "")
            + ", ".join(f"{k} {v / memory['gradient']:.1f}" for k, v in memory.items() if k != "gradient")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--amp", action="store_true", help="bf16 autocast in the forward")
    parser.add_argument("--compile", action="store_true", help="compile the pearlmutter engine (CUDA)")
    parser.add_argument("--models", default="demo,0.8M", help="comma-separated: demo, 0.8M, 20m (default demo,0.8M)")
    parser.add_argument("--ks", default="1,4,16", help="directions per pass to measure (default 1,4,16)")
    parser.add_argument("--trials", type=int, default=5, help="paired trials per engine and K (default 5)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated (default {','.join(ENGINES)})")
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave glibc's allocator as it is (default: keep freed memory, as tiny-llm's commands do)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory passes (a process each)")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/out/hvp_cost.json")
    args = parser.parse_args()
    if not args.glibc_defaults:
        keep_freed_memory()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available here")
    if args.memory_of:
        return _memory_of(args)
    report = {
        "device": args.device,
        "dtype": args.dtype,
        "amp": args.amp,
        "compile": args.compile,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "allocator": "glibc defaults" if args.glibc_defaults else "freed memory kept",
        "trials": args.trials,
        "at": time.strftime("%Y-%m-%d"),
        "models": {name: _paired_ratios(args, name) for name in args.models.split(",")},
    }
    _print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
