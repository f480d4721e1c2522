"""Where the float32 floor of a quadratic form comes from (run on demand, not a test).

    .venv/bin/python benchmarks/float32_floor.py                       # gpt2-small
    .venv/bin/python benchmarks/float32_floor.py --shapes 0.8M,pythia-160m

Every exact float32 Hessian-vector product (double backward, jvp of grad, curvlinops, ours) lands
about equally far from float64 (``real_shapes.py``): that distance is the floor. This script finds
what sets it. It takes ``real_shapes.py``'s model, tokens and 16 unit directions, computes the
forms vᵀHv by ``torch.func`` jvp of grad on a float64 copy, and runs chosen parts of that float64
model in float32 (the rest stays float64):

- the whole model in float32 (the floor itself);
- the matrix products (every linear layer and the output head), value and derivatives;
- those products' values only: each output is the float32 product's, its derivatives float64 (the
  float32 model's own forward, as a float64 method would differentiate it);
- those products' derivatives only: the values float64, every derivative product float32 (what a
  float32 method would add if its forward were exact);
- the linear layers alone and the head alone, value and derivatives.

Each row: the largest and the median difference from float64 over the 16 directions, relative to
the forms' root mean square, as in ``real_shapes.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from real_shapes import SHAPES, _jvp_of_grad, problem  # run as a script: benchmarks/ is on the path
from torch import nn

from tiny_llm.model.causal import CausalLM

_LINEAR, _LOGITS = nn.Linear.forward, CausalLM.logits


def _linear32(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = None if module.bias is None else module.bias.float()
    return F.linear(x.float(), module.weight.float(), bias).double()


def _logits32(model: CausalLM, h: torch.Tensor) -> torch.Tensor:
    return F.linear(h.float(), model.head_weight.float()).double()


def _value_only(low: Callable, exact: Callable) -> Callable:
    """The float32 value, float64 derivatives: exact + (low − exact), the difference a constant."""

    def run(module, x):
        y = exact(module, x)
        return y + (low(module, x) - y).detach()

    return run


def _derivatives_only(low: Callable, exact: Callable) -> Callable:
    """The float64 value, float32 derivatives: low − (low − exact), the difference a constant."""

    def run(module, x):
        y = low(module, x)
        return y - (y - exact(module, x)).detach()

    return run


@contextlib.contextmanager
def _float32(linear: Callable | None, logits: Callable | None) -> Iterator[None]:
    """Replace the linear layers' and the head's products for the duration (None: left float64)."""
    try:
        if linear is not None:
            nn.Linear.forward = linear
        if logits is not None:
            CausalLM.logits = logits
        yield
    finally:
        nn.Linear.forward, CausalLM.logits = _LINEAR, _LOGITS


VARIANTS = {
    "the matrix products: values and derivatives": (_linear32, _logits32),
    "the matrix products: values only": (_value_only(_linear32, _LINEAR), _value_only(_logits32, _LOGITS)),
    "the matrix products: derivatives only": (
        _derivatives_only(_linear32, _LINEAR),
        _derivatives_only(_logits32, _LOGITS),
    ),
    "the linear layers only": (_linear32, None),
    "the head only": (None, _logits32),
}


def _forms(model: nn.Module, tokens: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """vᵀ(Hv) for each direction by jvp of grad (``real_shapes.py``'s), in the model's dtype."""
    return _jvp_of_grad(model, tokens)(directions.to(next(model.parameters()).dtype))


def measure(name: str) -> dict[str, tuple[float, float]]:
    """Per variant: (max, median) of |forms − float64| ÷ RMS, as ``real_shapes.py`` draws them."""
    model, tokens, directions = problem(name)
    reference = copy.deepcopy(model).double()
    exact = _forms(reference, tokens, directions)
    rms = exact.square().mean().sqrt()

    def error(forms: torch.Tensor) -> tuple[float, float]:
        e = (forms - exact).abs() / rms
        return float(e.max()), float(e.median())

    rows = {"the whole model in float32 (the floor)": error(_forms(model, tokens, directions))}
    for label, (linear, logits) in VARIANTS.items():
        with _float32(linear, logits):
            rows[label] = error(_forms(reference, tokens, directions))
        print(f"  {name}: {label}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="gpt2-small", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.shapes.split(","):
        rows = measure(name)
        print(f"\n### {name}: float64 except the parts named, 16 directions (÷ RMS of the forms)\n")
        print("| in float32 | max | median |\n| --- | ---: | ---: |")
        for label, (high, mid) in rows.items():
            print(f"| {label} | {high:.1e} | {mid:.1e} |")


if __name__ == "__main__":
    main()
