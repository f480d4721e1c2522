"""HVP cost relative to a gradient on the demo model (run on demand, not a test).

    .venv/bin/python benchmarks/hvp_cost.py [--device cpu|cuda] [--dtype float32|float64] [--compile]

Measures, in one process so the ratios share the machine's state: the time of one full-epoch
gradient pass (forward + backward over the curvature micro-batches), the time of one full-epoch
HVP pass per direction for each engine and K directions per pass, and (in fresh subprocesses)
the peak memory of a gradient pass and of HVP passes. Targets (issue 3): one direction
≤ 2.0× gradient; batched ≤ 1.5× gradient per direction.
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

from tiny_llm.config import load_config
from tiny_llm.curvature import EpochHessian, Precision, pad_sequences
from tiny_llm.model import Llama, count_parameters, token_losses

REPO = Path(__file__).resolve().parents[1]


def _setup(args):
    config = load_config(REPO / "config/runs/demo.yaml")
    torch.manual_seed(0)
    precision = Precision(torch.device(args.device), getattr(torch, args.dtype), amp=args.amp)
    model = Llama(config.model, attention_backend="reference").to(precision.device, precision.dtype)
    n_sequences = config.steps_per_epoch * config.training.batch_size
    tokens = torch.randint(0, config.model.vocab_size, (n_sequences, config.data.seq_len + 1),
                           generator=torch.Generator().manual_seed(1))
    return config, precision, model, tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gradient_pass(model, batches, n_targets, precision) -> None:
    for inputs, targets in batches:
        loss = token_losses(precision.forward(model, inputs), targets).sum() / n_targets
        loss.backward()
    model.zero_grad(set_to_none=True)


def _timed(fn, device, repeats=3) -> float:
    fn()  # warm-up (and compilation)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_memory_mb(args, what: str) -> float:
    """Peak memory of one pass, measured in a fresh process (CUDA: allocator peak; CPU: RSS growth)."""
    command = [sys.executable, __file__, "--device", args.device, "--dtype", args.dtype, "--memory-of", what]
    if args.compile:
        command.append("--compile")
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip())


def _memory_of(args) -> None:
    config, precision, model, tokens = _setup(args)
    hvp_batch = config.training.micro_batch_size
    batches = [(x.to(precision.device), y.to(precision.device)) for x, y in pad_sequences(tokens, hvp_batch)]
    n_targets = tokens[:, 1:].numel()
    what = args.memory_of.split(":")
    kind = what[0]
    if precision.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(precision.device)
        base = torch.cuda.memory_allocated(precision.device)
    else:
        sampler = _RssSampler()
    if kind == "gradient":
        _gradient_pass(model, batches, n_targets, precision)
    else:
        engine, K = what[1], int(what[2])
        op = EpochHessian(model, tokens, batch_size=hvp_batch, engine=engine, precision=precision,
                          directions_per_pass=K, compile=args.compile and engine == "pearlmutter")
        op.quadratic_forms(torch.randn(K, op.flat.D, device=precision.device, dtype=precision.dtype))
    if precision.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(precision.device) - base
    else:
        peak = sampler.stop()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--compile", action="store_true", help="compile the pearlmutter engine")
    parser.add_argument("--ks", default="1,4,8,16")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/out/hvp_cost.json")
    args = parser.parse_args()
    if args.memory_of:
        return _memory_of(args)

    config, precision, model, tokens = _setup(args)
    hvp_batch = config.training.micro_batch_size
    batches = [(x.to(precision.device), y.to(precision.device)) for x, y in pad_sequences(tokens, hvp_batch)]
    n_targets = tokens[:, 1:].numel()
    gradient = _timed(lambda: _gradient_pass(model, batches, n_targets, precision), precision.device)
    rows = []
    for engine in ("double_backward", "pearlmutter"):
        for K in [int(k) for k in args.ks.split(",")]:
            op = EpochHessian(model, tokens, batch_size=hvp_batch, engine=engine, precision=precision,
                              directions_per_pass=K, compile=args.compile and engine == "pearlmutter")
            V = torch.randn(K, op.flat.D, device=precision.device, dtype=precision.dtype)
            seconds = _timed(lambda: op.quadratic_forms(V), precision.device)
            rows.append({"engine": engine, "K": K, "pass_seconds": seconds, "per_direction_seconds": seconds / K,
                         "per_direction_over_gradient": seconds / K / gradient})
    memory = {"gradient_mb": _peak_memory_mb(args, "gradient")}
    for engine in ("double_backward", "pearlmutter"):
        for K in (1, 8):
            memory[f"{engine}_K{K}_mb"] = _peak_memory_mb(args, f"hvp:{engine}:{K}")
    report = {"device": str(precision.device), "dtype": args.dtype, "amp": args.amp, "compile": args.compile,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "parameters_D": count_parameters(model),
              "epoch_sequences": len(tokens), "hvp_batch_size": hvp_batch, "gradient_seconds": gradient,
              "hvp": rows, "peak_memory": memory}
    print(f"D = {report['parameters_D']}, epoch = {len(tokens)} sequences x {config.data.seq_len} tokens, "
          f"{args.device} {args.dtype}{' amp' if args.amp else ''}{' compiled' if args.compile else ''}")
    print(f"gradient pass: {gradient * 1e3:.1f} ms")
    print(f"{'engine':<16} {'K':>3} {'pass ms':>9} {'per dir ms':>11} {'÷ gradient':>11}")
    for r in rows:
        print(f"{r['engine']:<16} {r['K']:>3} {r['pass_seconds'] * 1e3:>9.1f} {r['per_direction_seconds'] * 1e3:>11.1f} "
              f"{r['per_direction_over_gradient']:>11.2f}")
    print("peak memory (MB): " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in memory.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
