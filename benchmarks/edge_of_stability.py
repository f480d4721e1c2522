"""The adaptive edge of stability, measured with the project's own code: a tiny model trained
full-batch with Adam at a constant learning rate η, and at every few steps the preconditioned
sharpness λ_max(P^{1/2}HP^{1/2}) (P from the optimizer's state after the step, through
``moments_from_optimizer`` and ``preconditioner``; H the epoch Hessian through ``EpochHessian``;
the top eigenvalue by the project's Lanczos) against Adam's threshold (2 + 2β1)/((1 − β1)η),
38/η at β1 = 0.9 (Cohen et al. 2022). The plain λ_max(H) is measured beside it.

    .venv/bin/python benchmarks/edge_of_stability.py                 # ~10 min on 2 CPU cores
    .venv/bin/python benchmarks/edge_of_stability.py --lrs 1e-3 3e-3 --steps 600 --every 20

Writes benchmarks/out/edge_of_stability.json and docs/figures/edge_of_stability.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from tiny_llm.config import ModelConfig
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.spectrum import top_eigenpairs
from tiny_llm.data.corpus import demo_corpus
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama
from tiny_llm.model.moments import moments_from_optimizer, preconditioner, stability_threshold

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16)
BETA1, BETA2 = 0.9, 0.999


def tokens(rows: int = 32, seq: int = 16) -> torch.Tensor:
    """The full batch: the demo corpus's bytes folded into the vocabulary, ``rows`` rows of seq + 1."""
    data = torch.tensor(list(demo_corpus(rows * (seq + 1), seed=1)), dtype=torch.long) % MODEL.vocab_size
    return data.view(rows, seq + 1)


def sharpness(model: Llama, batch: torch.Tensor, scale: torch.Tensor | None) -> float:
    """λ_max of H (``scale`` None) or of SHS (S = diag(scale)) by Lanczos on the epoch Hessian."""
    operator = EpochHessian(
        model,
        batch,
        batch_size=len(batch),
        engine="double_backward",
        precision=Precision(torch.device("cpu"), torch.float64),
    )

    def product(V: torch.Tensor) -> torch.Tensor:
        return operator.hvp(V) if scale is None else scale * operator.hvp(scale * V)

    values, _, _, converged = top_eigenpairs(product, operator.flat.D, 1, 80, seed=0, tolerance=1e-6)
    if not bool(converged[0]):
        print("  (Lanczos did not converge to 1e-6 in 80 steps)", flush=True)
    return float(values[0])


def train(lr: float, steps: int, every: int, batch: torch.Tensor) -> list[dict]:
    """Full-batch AdamW (no decay) at constant ``lr``; the sharpnesses every ``every`` steps."""
    torch.manual_seed(0)
    model = Llama(MODEL, attention_backend="reference").double()
    named = list(model.named_parameters())
    group = {"params": [p for _, p in named], "param_names": [n for n, _ in named]}
    optimizer = torch.optim.AdamW([group], lr=lr, betas=(BETA1, BETA2), eps=1e-8, weight_decay=0.0)
    flat, records = FlatParameters(model), []
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        loss = token_losses(model(batch[:, :-1]), batch[:, 1:]).mean()
        loss.backward()
        optimizer.step()
        if step % every and step != 1:
            continue
        P = preconditioner(moments_from_optimizer(optimizer.state_dict()))
        scale = flat.flatten([P[n] for n in flat.names]).sqrt()
        record = {
            "step": step,
            "loss": float(loss),
            "preconditioned_sharpness": sharpness(model, batch, scale),
            "sharpness": sharpness(model, batch, None),
            "threshold": stability_threshold(BETA1, lr),
        }
        records.append(record)
        print(f"lr {lr:g} step {step}: loss {record['loss']:.4f}, λ_max(PH) {record['preconditioned_sharpness']:.4g} "
              f"(threshold {record['threshold']:.4g}), λ_max(H) {record['sharpness']:.4g}", flush=True)  # fmt: skip
    return records


def draw(runs: dict[float, list[dict]], path: Path) -> None:
    fig, (ax, plain, loss) = plt.subplots(1, 3, figsize=(9.0, 2.6))
    for i, (lr, records) in enumerate(runs.items()):
        steps = [r["step"] for r in records]
        plain.plot(steps, [r["sharpness"] for r in records], "o-", ms=2, color=f"C{i}", label=f"λ_max(H), η = {lr:g}")
        ax.plot(
            steps,
            [r["preconditioned_sharpness"] for r in records],
            "o-",
            ms=2,
            color=f"C{i}",
            label=f"λ_max(PH), η = {lr:g}",
        )
        ax.axhline(
            stability_threshold(BETA1, lr),
            color=f"C{i}",
            ls="--",
            lw=0.8,
            label=f"38/η = {stability_threshold(BETA1, lr):.3g}",
        )
        loss.plot(steps, [r["loss"] for r in records], "-", color=f"C{i}", label=f"η = {lr:g}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("step (full batch)")
    ax.set_ylabel("preconditioned sharpness")
    ax.legend(fontsize=6, frameon=False)
    plain.set_yscale("log")
    plain.set_xlabel("step (full batch)")
    plain.set_ylabel("plain sharpness")
    plain.legend(fontsize=6, frameon=False)
    loss.set_xlabel("step (full batch)")
    loss.set_ylabel("training loss (nats)")
    loss.legend(fontsize=6, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=200)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    batch, started = tokens(), time.perf_counter()
    runs = {lr: train(lr, args.steps, args.every, batch) for lr in args.lrs}
    out = ROOT / "benchmarks" / "out" / "edge_of_stability.json"
    out.parent.mkdir(exist_ok=True)
    record = {"model": MODEL.__dict__, "beta1": BETA1, "beta2": BETA2, "runs": {str(k): v for k, v in runs.items()}}
    out.write_text(json.dumps(record, indent=1))
    draw(runs, ROOT / "docs" / "figures" / "edge_of_stability.png")
    print(f"{time.perf_counter() - started:.0f} s; {out}")


if __name__ == "__main__":
    main()
