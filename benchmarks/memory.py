"""Fit and check the memory model of the curvature passes (tiny_llm.curvature.memory).

Measures the peak live storage of one pass per engine (and of a gradient pass) on CPU with a
storage-counting dispatch mode, over a seeded random grid of small shapes, a grid at the 20M
model's width (d = 512, 8 heads, f = 1368) with one or two layers and T up to 2048, a grid of real
vocabularies (8k to 152k) at small widths for each architecture, and the checkpoints' own widths
and vocabularies with one layer, the head whole and in 64-token chunks where the pass can; fits,
per engine, the four-phase model of tiny_llm.curvature.memory by alternating non-negative least
squares (relative error); and prints (or with --write writes) the coefficients of memory_fit.py
and the predicted/measured ratios.

    python benchmarks/memory.py --fit            # measure, save the counts, fit, print coefficients (about an hour)
    python benchmarks/memory.py --refit          # fit the saved counts again (seconds)
    python benchmarks/memory.py --real           # predicted vs counted at GPT-2-small, Pythia-160M, Llama-3.2-1B
    python benchmarks/memory.py                  # check the committed coefficients on fresh grids
    python benchmarks/memory.py --device cuda    # the campaign's shape against the CUDA allocator (~1 min)
    python benchmarks/memory.py --shape config/runs/demo.yaml   # the same check of a run's shape on CPU

The shape check measures each engine's pass at a run's real shape (on CUDA by default the 20M
model: 6 layers, T = 1024) with ``torch.cuda.max_memory_allocated`` (CPU: storage counts), then
runs one curvature micro-batch of the campaign's settings (64 sequences, K = 16, bf16 autocast) cut
for a budget (40 GiB at the 20M shape) and compares its whole peak with the plan's prediction and
the budget.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from tiny_llm.config import ModelConfig, load_config
from tiny_llm.curvature.engines import ENGINES as ENGINE_REGISTRY
from tiny_llm.curvature.engines import benchmarked
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.curvature.memory import (
    COEFFICIENTS,
    GRADIENT,
    PHASES,
    GiB,
    JobShape,
    PassShape,
    features,
    pass_bytes,
    plan_analysis,
    size,
)
from tiny_llm.curvature.memory_measure import StoragePeak, measure_pass
from tiny_llm.model.llama import Llama

ENGINES = (*benchmarked("memory"), GRADIENT)  # the registry's, and the plain gradient pass


def small_grid(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        dict(
            L=rng.choice([1, 2, 3]),
            d=rng.choice([16, 32, 64]),
            h=rng.choice([1, 2, 4, 8]),
            f=rng.choice([24, 48, 96, 172]),
            V=rng.choice([16, 64, 256]),
            T=rng.choice([16, 64, 128, 256]),
            B=rng.choice([1, 2, 3]),
            K=rng.choice([1, 2, 4, 8]),
        )
        for _ in range(n)
    ]


def wide_grid() -> list[dict]:
    return [
        dict(L=L, d=512, h=8, f=1368, V=256, T=T, B=1, K=K)
        for T, L, K in itertools.product([256, 1024, 2048], [1, 2], [1, 4])
        if T < 2048 or L == 1
    ]


CHUNKED = (*(e.name for e in ENGINE_REGISTRY.values() if e.head_chunks), GRADIENT)
"""The passes that take the head in token chunks (the memory plan's head_tokens)."""


def vocabulary_grid(engine: str) -> list[dict]:
    """Real vocabularies at small widths, each architecture, the head whole and (for the passes
    that chunk it) 64 tokens at a time: where the logits, not the layers, set the peak."""
    heads = (None, 64) if engine in CHUNKED else (None,)
    return [
        dict(L=L, d=d, h=4, f=4 * d, V=V, T=T, B=1, K=K, arch=arch, head=head)
        for (d, V), T, L, K, head in itertools.product(
            [(64, 32768), (128, 8192), (128, 50257), (64, 151936)], [64, 256], [1, 2], [1, 4], heads
        )
        for arch in [("llama", "gpt2", "gpt_neox")[(d + V + T + L + K) % 3]]
    ]


REAL_SHAPES = {
    "gpt2-small": dict(arch="gpt2", d=768, h=12, f=3072, V=50257),
    "pythia-160m": dict(arch="gpt_neox", d=768, h=12, f=3072, V=50304),
    "llama-3.2-1b": dict(arch="llama", d=2048, h=32, kv=8, f=8192, V=128256),
}
"""Checkpoints' widths and vocabularies, with one or two layers and one sequence."""


def real_directions(engine: str, name: str) -> tuple[int, ...]:
    """K at a real width: up to 16 where this machine's memory allows (23 GB; the HVP engines hold
    K parameter-sized products and Llama-3.2-1B's one layer has 330M parameters)."""
    if engine == GRADIENT:
        return (1,)
    if ENGINE_REGISTRY[engine].forms:
        return (1, 4) if name == "llama-3.2-1b" else (1, 4, 16)
    return (1,) if name == "llama-3.2-1b" else (1, 4)


def real_grid(engine: str, L: int = 2, T: tuple[int, ...] = (256,)) -> list[dict]:
    """The checkpoints' shapes (``--real``: two layers, T = 256, which the fit does not see)."""
    heads = (None, 64) if engine in CHUNKED else (None,)
    return [
        {**shape, "name": name, "L": L, "T": t, "B": 1, "K": K, "head": head}
        for name, shape in REAL_SHAPES.items()
        for t in T
        for K in real_directions(engine, name)
        for head in heads
    ]


def fitting_grid(engine: str, points: int) -> list[dict]:
    """What ``--fit`` measures: small shapes, the 20M width to T = 2048, real vocabularies at small
    widths, and the checkpoints' shapes with one layer at T = 128 and 256 and two at T = 128
    (``--real`` holds out two layers at T = 256)."""
    real = real_grid(engine, L=1, T=(128, 256)) + real_grid(engine, L=2, T=(128,))
    return small_grid(points, 0) + wide_grid() + vocabulary_grid(engine) + real


def config_of(p: dict) -> ModelConfig:
    arch = p.get("arch", "llama")
    return ModelConfig(
        architecture=arch,
        vocab_size=p["V"],
        d_model=p["d"],
        n_heads=p["h"],
        n_kv_heads=p.get("kv"),
        d_ff=p["f"],
        n_layers=p["L"],
        max_seq_len=p["T"],
        rotary_pct=0.25 if arch == "gpt_neox" else 1.0,
        tie_embeddings=arch != "gpt_neox",
    )


def shape_of(engine: str, p: dict) -> PassShape:
    """The pass of ``engine`` at point ``p`` (float32 numbers)."""
    return PassShape(
        engine=engine, config=config_of(p), rows=p["B"], K=p["K"], seq_len=p["T"], head_tokens=p.get("head")
    )


def measure(engine: str, points: list[dict], dtype: torch.dtype = torch.float32) -> list[dict]:
    out = []
    for p in points:
        started = time.perf_counter()
        peak = measure_pass(shape_of(engine, p), dtype)
        out.append({**p, "peak": peak, "seconds": time.perf_counter() - started})
        if "name" in p or p["d"] >= 512:  # the slow ones
            print(
                f"  {engine} {p.get('name', p['d'])} L={p['L']} T={p['T']} K={p['K']} head {p.get('head')}: "
                f"{size(peak)} in {out[-1]['seconds']:.0f} s",
                flush=True,
            )
    return out


def design(points: list[dict], phase: tuple[str, ...]) -> np.ndarray:
    rows = []
    for p in points:
        x = features(config_of(p), p["B"], p["T"], head_tokens=p.get("head"))
        rows.append([x[name] * (p["K"] if slope else 1) for name in phase for slope in (0, 1)])
    return np.array(rows, dtype=float)


def nnls(A: np.ndarray, b: np.ndarray, tolerance: float = 1e-10) -> np.ndarray:
    """argmin ‖Ax − b‖ over x ≥ 0 (Lawson and Hanson's active set). Memory is a sum of what a pass
    holds, so no term is negative; unconstrained, the fit traded one feature against a correlated
    one (D against the head's V·d at small widths) and under-predicted where they part (1B widths)."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1
    A = A / scale
    x = np.zeros(A.shape[1])
    passive = np.zeros(A.shape[1], dtype=bool)
    for _ in range(10 * A.shape[1]):
        gradient = A.T @ (b - A @ x)
        if passive.all() or gradient[~passive].max() <= tolerance * np.abs(b).max():
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros_like(x)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            shrinking = passive & (z <= 0)
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > tolerance
            x[~passive] = 0
    return x / scale


FLOOR = 0.805
"""The least fraction of a fitting point's measured peak a fit may predict."""


def fit(points: list[dict], itemsize: int = 4, iterations: int = 100) -> tuple[dict, ...]:
    """Max-of-phases fit by alternating non-negative least squares, weighted to minimise relative
    error. Each point starts in the phase whose own feature (h·T, f, V, or D for the last) is
    largest, D weighted by each of a few factors in turn; the fit whose worst relative error is
    smallest is kept (alternation finds a local optimum, which depends on where it starts), scaled
    up where it predicts less than FLOOR of a measured peak."""
    y = np.array([p["peak"] / itemsize for p in points])
    X = [design(points, phase) for phase in PHASES]
    own = np.array(
        [
            [features(config_of(p), p["B"], p["T"], head_tokens=p.get("head"))[name] for name in ("hT", "f", "V", "D")]
            for p in points
        ]
    )
    best, best_worst = None, np.inf
    for weight in (1.0, 0.1, 0.01, 0.001, 0.0):
        assign = (own * np.array([1, 1, 1, weight])).argmax(axis=1)
        coefficients = [np.zeros(x.shape[1]) for x in X]
        for _ in range(iterations):
            for k, x in enumerate(X):
                chosen = assign == k
                if chosen.sum() >= x.shape[1] // 2:
                    w = 1 / y[chosen]
                    coefficients[k] = nnls(x[chosen] * w[:, None], y[chosen] * w)
            predicted = np.stack([x @ c for x, c in zip(X, coefficients, strict=True)], axis=1)
            new = predicted.argmax(axis=1)
            if (new == assign).all():
                break
            assign = new
        ratios = predicted.max(axis=1) / y
        lift = max(1.0, FLOOR / ratios.min())  # under-predicting (running out of memory) costs more
        worst = np.abs(np.log(ratios * lift)).max()
        if worst < best_worst:
            best, best_worst = [c * lift for c in coefficients], worst
    return tuple(
        {name: (round(float(c[2 * i]), 3), round(float(c[2 * i + 1]), 3)) for i, name in enumerate(phase)}
        for phase, c in zip(PHASES, best, strict=True)
    )


def report(engine: str, measured: list[dict], itemsize: int = 4, label: str = "") -> float:
    ratios = [pass_bytes(dataclasses.replace(shape_of(engine, p), itemsize=itemsize)) / p["peak"] for p in measured]
    worst = max(abs(r - 1) for r in ratios)
    wide = [r for r, p in zip(ratios, measured, strict=True) if p["d"] == 512]
    print(
        f"{engine + label:>22}: predicted/measured over {len(ratios)} shapes: min {min(ratios):.3f}, "
        f"max {max(ratios):.3f}, worst {worst:.1%}" + (f"; at d=512: {min(wide):.3f}-{max(wide):.3f}" if wide else ""),
        flush=True,
    )
    return worst


def shape_check(config_path: Path, device: str, out: Path | None) -> list[dict]:
    """Predicted vs measured peak of each engine's pass at a run's real shape (CUDA: the allocator's
    peak; CPU: storage counts), then one curvature micro-batch of 64 sequences with K = 16 (adjoint,
    bf16 autocast) cut for a budget a third of its unchunked need (40 GiB at the 20M shape), whose
    whole peak is compared with the plan's prediction and the budget."""
    config = load_config(config_path)
    T, rows = config.data.seq_len, []
    for engine in ENGINES:
        for B, K in ((1, 1), (2, 1), (1, 16), (2, 16)):
            if engine == GRADIENT and K > 1:
                continue
            shape = PassShape(engine=engine, config=config.model, rows=B, K=K, seq_len=T)
            predicted = pass_bytes(shape)
            try:
                measured = measure_pass(shape, device=device)
            except torch.OutOfMemoryError:
                measured = None
            if device == "cuda":
                torch.cuda.empty_cache()
            rows.append({"engine": engine, "B": B, "K": K, "predicted": predicted, "measured": measured})
            ratio = "out of memory" if measured is None else f"{predicted / measured:.3f}"
            print(
                f"{engine:>17} B={B} K={K:>2}: predicted {size(predicted):>9}, measured "
                f"{'-' if measured is None else size(measured):>9}, ratio {ratio}",
                flush=True,
            )
    job = JobShape(
        config=config.model, seq_len=T, engine="adjoint", K=16, hvp_batch_size=64, micro_batch_size=32, itemsize=4
    )
    unbounded = plan_analysis(
        job,
        audit_directions=None,
        extra_vectors=0,
        budget_bytes=None,
    )
    budget = min(40 * GiB, unbounded.peak_bytes // 3)
    plan = plan_analysis(
        job,
        audit_directions=None,
        extra_vectors=0,
        budget_bytes=budget,
    )
    forms = next(p for p in plan.passes if p.name == "forms")
    target = torch.device(device)
    if target.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(target)
    with StoragePeak() if target.type == "cpu" else contextlib.nullcontext() as counter:
        model = Llama(config.model, attention_backend="reference").to(target)
        tokens = torch.randint(0, config.model.vocab_size, (64, T + 1), device=target)
        H = EpochHessian(
            model,
            tokens,
            batch_size=64,
            engine="adjoint",
            directions_per_pass=16,
            precision=Precision(target, torch.float32, amp=True),
            group_rows=plan.rows("forms"),
        )
        H.quadratic_forms(torch.randn(16, H.flat.D, device=target))
    peak = counter.peak if target.type == "cpu" else torch.cuda.max_memory_allocated(target)
    print(
        f"micro-batch of 64 sequences, K = 16, adjoint, bf16 autocast, budget {size(budget)}: groups of "
        f"{forms.rows}, predicted job peak {size(forms.peak_bytes)}, measured {size(peak)} "
        f"({peak / forms.peak_bytes:.3f} of predicted; {'within' if peak <= budget else 'OVER'} the budget)",
        flush=True,
    )
    rows.append(
        {"micro_batch": {"budget": budget, "group_rows": forms.rows, "predicted": forms.peak_bytes, "measured": peak}}
    )
    if out:
        name = torch.cuda.get_device_name(0) if target.type == "cuda" else "cpu"
        out.write_text(json.dumps({"device": name, "config": str(config_path), "rows": rows}, indent=1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="measure the fitting grids and print new coefficients")
    parser.add_argument("--refit", action="store_true", help="fit the counts --fit saved (--measurements)")
    parser.add_argument("--write", action="store_true", help="with --fit/--refit: write the fit into memory_fit.py")
    parser.add_argument(
        "--measurements",
        type=Path,
        default=Path(__file__).with_name("memory_points.json"),
        help="where --fit saves its counts and --refit reads them (default benchmarks/memory_points.json)",
    )
    parser.add_argument("--points", type=int, default=150, help="random small shapes per engine")
    parser.add_argument("--engines", default=",".join(ENGINES), help="engines to fit or check (default all)")
    parser.add_argument("--device", default="cpu", help="cpu (storage counts) or cuda (allocator peaks)")
    parser.add_argument(
        "--shape",
        type=Path,
        help="check at this run configuration's real shape (default on cuda: config/runs/20m.yaml)",
    )
    parser.add_argument("--out", type=Path, help="JSON of the shape check, or of --real's measurements")
    parser.add_argument(
        "--real", action="store_true", help="check at GPT-2-small, Pythia-160M and Llama-3.2-1B widths (minutes)"
    )
    args = parser.parse_args()
    if args.device == "cuda" or args.shape:
        shape_check(args.shape or Path(__file__).resolve().parents[1] / "config/runs/20m.yaml", args.device, args.out)
        return
    torch.set_num_threads(1)
    if args.real:
        table = {}
        for engine in args.engines.split(","):
            measured = measure(engine, real_grid(engine))
            report(engine, measured)
            for p in measured:
                predicted = pass_bytes(shape_of(engine, p))
                print(
                    f"  {p['name']:>13} K={p['K']:>2} head {p['head'] or 'whole':>5}: counted {size(p['peak']):>9}, "
                    f"predicted {size(predicted):>9}, ratio {predicted / p['peak']:.2f}",
                    flush=True,
                )
            table[engine] = measured
        if args.out:
            args.out.write_text(json.dumps(table, indent=1))
        return
    if args.fit or args.refit:
        saved = json.loads(args.measurements.read_text()) if args.measurements.exists() else {}
        fitted = {}
        for engine in args.engines.split(","):
            if args.fit:  # each engine's counts are saved as soon as they are measured
                saved[engine] = measure(engine, fitting_grid(engine, args.points))
                args.measurements.write_text(json.dumps(saved, indent=0))
            fitted[engine] = fit(saved[engine])
            COEFFICIENTS[engine] = fitted[engine]
            report(engine, saved[engine])
        text = "COEFFICIENTS.update({\n"
        for engine, phases in fitted.items():
            text += f"    {engine!r}: (\n" + "".join(f"        {phase},\n" for phase in phases) + "    ),\n"
        text += "})\n"
        if args.write:  # replace those engines' entries in memory_fit.py (then: ruff format)
            target = Path(__file__).resolve().parents[1] / "src/tiny_llm/curvature/memory_fit.py"
            head = target.read_text().split("COEFFICIENTS.update(")[0]
            target.write_text(head + f"COEFFICIENTS.update({ {**COEFFICIENTS, **fitted}!r})\n")
        print(text)
        return
    for engine in args.engines.split(","):  # fresh shapes (another seed), float32 and float64
        report(engine, measure(engine, small_grid(40, 1)))
        report(engine, measure(engine, small_grid(15, 2), torch.float64), itemsize=8, label=" float64")


if __name__ == "__main__":
    main()
