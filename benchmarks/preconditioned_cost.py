"""What a quadratic form in the optimizer's geometry costs beside a plain one, at GPT-2 small's width
and vocabulary (``real_shapes.py``'s shape: 2 layers, T = 256, one sequence, CPU float32, one
thread), through the measurement's own :class:`~tiny_llm.curvature.directions.DirectionRunner`:
each trial times a gradient pass, then 16 noise directions v (float64, as the measurement holds
them) queued plainly and measured in one adjoint K = 16 pass, then the same 16 in the optimizer's
coordinates as the measurement queues them (vᵤ = s ⊙ v with s = P^{1/2} from a real AdamW state,
the runner feeding s ⊙ vᵤ), everything from the queueing on timed.

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/preconditioned_cost.py [--trials 5]

Prints seconds per direction ÷ the gradient pass (median and range of the per-trial ratios) and
the preconditioned directions' extra seconds per direction, and writes
benchmarks/out/preconditioned_cost.json. The extra is elementwise work on D-sized vectors, the
same whatever the epoch; the forms and the gradient grow with the epoch's tokens, so the ratio here
(one sequence of 256 tokens) is the largest an analysis sees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from real_shapes import CPU, _loss, _seconds, problem

from tiny_llm.curvature.directions import DirectionRunner
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.records import Direction
from tiny_llm.curvature.vectors import Vectors
from tiny_llm.model.moments import moments_from_optimizer, preconditioner
from tiny_llm.runtime import keep_freed_memory

OUT = Path(__file__).resolve().parent / "out" / "preconditioned_cost.json"


def adam_scale(model, tokens) -> torch.Tensor:
    """P^{1/2} of a real AdamW state (float64): two steps on ``tokens`` from the model's weights (restored)."""
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
    return flat.flatten([P[n] for n in flat.names]).sqrt()


def measured(operator: EpochHessian, V: torch.Tensor, scale: torch.Tensor | None) -> float:
    """Seconds to queue the rows of V (as the measurement does, in the coordinates ``scale`` gives)
    and measure them in one pass."""
    placement = operator.placement
    runner = DirectionRunner(
        operator, 16, True, Vectors(placement.layout, placement.pieces, 0), 16, torch.float32, print
    )
    runner.progress = lambda message: None
    started = time.perf_counter()
    for v in V:
        runner.add(v if scale is None else v * scale, Direction(), started, scale)
    runner.flush()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as the analysis jobs do
    model, tokens, V = problem("gpt2-small")
    V, scale = V.double(), adam_scale(model, tokens)
    operator = EpochHessian(
        model, tokens, batch_size=len(tokens), engine="adjoint", precision=Precision(CPU, torch.float32),
        directions_per_pass=16,
    )  # fmt: skip
    ratios: dict[str, list[float]] = {"plain": [], "preconditioned": []}
    extra: list[float] = []
    for _ in range(args.trials):
        gradient = _seconds(lambda: torch.autograd.grad(_loss(model, tokens), list(model.parameters())), CPU)
        plain, preconditioned = measured(operator, V, None), measured(operator, V, scale)
        ratios["plain"].append(plain / 16 / gradient)
        ratios["preconditioned"].append(preconditioned / 16 / gradient)
        extra.append((preconditioned - plain) / 16)
    table = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()}
    for key, row in table.items():
        print(f"{key:>15}: {row['median']:.3f} ({row['min']:.3f}-{row['max']:.3f}) gradients per direction")
    print(
        f"extra per preconditioned direction: {statistics.median(extra) * 1e3:.1f} ms (D = {FlatParameters(model).D:,})"
    )
    OUT.parent.mkdir(exist_ok=True)
    record = {"shape": "gpt2-small", "engine": "adjoint", "K": 16, "ratios": table, "extra_seconds": extra}
    OUT.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
