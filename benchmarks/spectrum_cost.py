"""Lanczos step time over HVP time, and finite-difference HVP time over exact HVP time (on demand).

    .venv/bin/python benchmarks/spectrum_cost.py [--device cpu|cuda] [--dtype float32|float64] [--steps 20]

Same model and epoch as hvp_cost.py (demo model, 128 sequences x 64 tokens). A Lanczos step is one
HVP plus full reorthogonalisation against the basis so far; the ratio is averaged over ``steps``
steps, so it includes the reorthogonalisation cost at the average basis size.
"""

from __future__ import annotations

import argparse
import time

import torch
from hvp_cost import REPO

from tiny_llm.config import load_config
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.curvature.spectrum import Basis, lanczos
from tiny_llm.model.llama import Llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    config = load_config(REPO / "config/runs/demo.yaml")
    torch.manual_seed(0)
    precision = Precision(torch.device(args.device), getattr(torch, args.dtype))
    tokens = torch.randint(
        0, config.model.vocab_size, (128, config.data.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    model = Llama(config.model, attention_backend="reference").to(precision.device, precision.dtype)
    fused = Llama(config.model, attention_backend="sdpa").to(precision.device, precision.dtype)
    fused.load_state_dict(model.state_dict())
    exact = EpochHessian(model, tokens, batch_size=8, engine="double_backward", precision=precision)
    fd = EpochHessian(fused, tokens, batch_size=8, engine="finite_difference", precision=precision)
    v = torch.randn(1, exact.flat.D, dtype=torch.float64)

    def timed(fn, repeats=3):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats

    hvp = timed(lambda: exact.hvp(v))
    fd_time = timed(lambda: fd.hvp(v))
    start = time.perf_counter()
    result = lanczos(exact.hvp, v[0], args.steps)
    step = (time.perf_counter() - start) / len(result.alpha)
    for basis in (torch.bfloat16,):
        start = time.perf_counter()
        low = lanczos(exact.hvp, v[0], args.steps, basis=Basis(basis, torch.float32))
        low_step = (time.perf_counter() - start) / len(low.alpha)
    top = torch.linalg.eigvalsh(result.tridiagonal())[-3:]
    top_low = torch.linalg.eigvalsh(low.tridiagonal())[-3:]
    print(f"D = {exact.flat.D}, {args.device} {args.dtype}, {args.steps} Lanczos steps")
    print(
        f"exact HVP (double backward): {hvp * 1e3:.1f} ms; finite-difference HVP (sdpa): {fd_time * 1e3:.1f} ms "
        f"-> FD / exact = {fd_time / hvp:.2f}"
    )
    print(f"Lanczos step (float64 basis): {step * 1e3:.1f} ms -> step / HVP = {step / hvp:.3f}")
    print(f"Lanczos step (bf16 basis, fp32 reductions): {low_step * 1e3:.1f} ms -> step / HVP = {low_step / hvp:.3f}")
    print(
        f"top-3 Ritz values float64 basis {top.tolist()}; bf16 basis {top_low.tolist()}; "
        f"max relative difference {float(((top - top_low) / top).abs().max()):.2e}"
    )


if __name__ == "__main__":
    main()
