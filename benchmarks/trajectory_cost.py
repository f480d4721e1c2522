"""What the trajectory statistics add to a (state, case) measurement (run on demand, not a test).

    .venv/bin/python benchmarks/trajectory_cost.py [--trials 3] [--shapes demo,wide]

For each shape, one process times ``measure_case`` on the same model and epoch without a successor
and with one (a step Δ to a nearby state), alternately, so that every ratio pairs two measurements
taken under the same machine load; it reports the median ratio and the work each adds: the step's
quadratic form rides in the passes over the epoch that the noise and random directions already
make (one more pass only when it crosses a multiple of K), and the loss at θ + Δ comes from one
more forward pass over the epoch. Shapes: ``demo`` (the demo run: D = 28,832, 8 batches of 16 × 64
tokens, S_v = all, S_r = 32, K = 16, float64 as the demo analyses) and ``wide`` (GPT-2-small's
width and vocabulary, 1 layer, 4 batches of 4 × 128 tokens, S_v = 4, S_r = 4, float32).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from hvp_cost import REPO

from tiny_llm.architectures import build_model
from tiny_llm.config import load_config
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.tokens import BatchPlan

SHAPES = {
    "demo": ({}, 8, 16, 64, dict(noise_samples=None, random_samples=32), torch.float64),
    "wide": (
        dict(architecture="gpt2", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=1, max_seq_len=128),
        4,
        4,
        128,
        dict(noise_samples=4, random_samples=4),
        torch.float32,
    ),
}


class _Tokens:
    """Random token blocks as a cache would serve them."""

    def __init__(self, vocab: int, length: int, rows: int):
        self.rows = torch.randint(0, vocab, (rows, length + 1), generator=torch.Generator().manual_seed(1))

    def tokens(self, blocks):
        return self.rows[torch.as_tensor(blocks)]

    def position(self, block):
        return (0, int(block))


def _measure(name: str, trials: int) -> None:
    changes, batches, batch, seq_len, samples, dtype = SHAPES[name]
    demo = load_config(REPO / "config/runs/demo.yaml")
    shape = dataclasses.replace(demo.model, **changes)
    torch.manual_seed(0)
    model = build_model(shape, attention_backend="reference").to(dtype)
    cache = _Tokens(shape.vocab_size, seq_len, batches * batch)
    plan = BatchPlan(
        "bench", torch.arange(batches * batch).reshape(batches, batch).numpy(), torch.arange(batches).numpy()
    )
    flat = FlatParameters(model)
    step = 1e-3 * torch.randn(flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    inputs = CaseInputs(
        cache=cache, plan=plan, micro_batch_size=batch, hvp_batch_size=batch, seed=1, engine="adjoint",
        directions_per_pass=16, compile=False, **samples,
    )  # fmt: skip
    precision = Precision(torch.device("cpu"), dtype)
    ratios, counts = [], {}
    for _ in range(trials):
        times = {}
        for label, case in (("without", inputs), ("with", dataclasses.replace(inputs, step=step))):
            started = time.perf_counter()
            counts[label] = measure_case(model, case, precision)["counts"]
            times[label] = time.perf_counter() - started
        ratios.append(times["with"] / times["without"])
        print(f"{name}: without {times['without']:.2f} s, with {times['with']:.2f} s", flush=True)
    passes = {label: counts[label].get("hvp_passes") for label in counts}
    print(
        f"{name} (D = {flat.D:,}): median ratio {statistics.median(ratios):.3f} over {trials} paired trials; "
        f"passes without {passes['without']}, with {passes['with']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--shapes", default="demo,wide")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.shapes.split(","):
        _measure(name, args.trials)


if __name__ == "__main__":
    main()
