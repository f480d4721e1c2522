"""What a quadratic form in the optimizer's geometry costs beside a plain one, at GPT-2 small's width
and vocabulary (``real_shapes.py``'s shape: 2 layers, T = 256, one sequence, CPU float32, one
thread): each trial times a gradient pass, then adjoint K = 16 forms of 16 plain directions v, then
the 16 directions the measurement feeds for the preconditioned statistics, s ⊙ (s ⊙ v) with
s = P^{1/2} from a real AdamW state (two steps on the same tokens), scaling included.

    .venv/bin/python benchmarks/preconditioned_cost.py [--trials 5]

Prints seconds per direction ÷ the gradient pass (median and range of the per-trial ratios), and
writes benchmarks/out/preconditioned_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from real_shapes import CPU, _loss, _ours, _seconds, problem

from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.model.moments import moments_from_optimizer, preconditioner

OUT = Path(__file__).resolve().parent / "out" / "preconditioned_cost.json"


def adam_scale(model, tokens) -> torch.Tensor:
    """P^{1/2} of a real AdamW state: two steps on ``tokens`` from the model's weights (restored)."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    named = list(model.named_parameters())
    group = {"params": [p for _, p in named], "param_names": [n for n, _ in named]}
    optimizer = torch.optim.AdamW([group], lr=1e-4)
    for _ in range(2):
        optimizer.zero_grad()
        _loss(model, tokens).backward()
        optimizer.step()
    P = preconditioner(moments_from_optimizer(optimizer.state_dict()))
    model.load_state_dict(saved)
    flat = FlatParameters(model)
    return flat.flatten([P[n] for n in flat.names]).sqrt().float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokens, V = problem("gpt2-small")
    scale = adam_scale(model, tokens)
    forms = _ours(model, tokens, "adjoint", 16, Precision(CPU, torch.float32))
    ratios: dict[str, list[float]] = {"plain": [], "preconditioned": [], "scaling alone": []}
    for _ in range(args.trials):
        gradient = _seconds(lambda: torch.autograd.grad(_loss(model, tokens), list(model.parameters())), CPU)
        plain = _seconds(lambda: forms(V), CPU)
        started = time.perf_counter()
        scaled = scale * (scale * V)  # the runner: u-vector s ⊙ v, then the direction s ⊙ u
        scaling = time.perf_counter() - started
        preconditioned = _seconds(lambda scaled=scaled: forms(scaled), CPU) + scaling
        for key, seconds in (("plain", plain), ("preconditioned", preconditioned), ("scaling alone", scaling)):
            ratios[key].append(seconds / 16 / gradient)
    table = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()}
    for key, row in table.items():
        print(f"{key:>15}: {row['median']:.3f} ({row['min']:.3f}-{row['max']:.3f}) gradients per direction")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"shape": "gpt2-small", "engine": "adjoint", "K": 16, "ratios": table}, indent=1))


if __name__ == "__main__":
    main()
