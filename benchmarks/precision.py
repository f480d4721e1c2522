"""How far each reduced-precision mode's statistics are from float64 (run on demand, not a test).

    .venv/bin/python benchmarks/precision.py [--device cpu|cuda] [--models demo,0.8M] [--samples 8]

For each model (the demo shape, D = 28,832; and d_model 128, 4 layers, seq 128, D = 824,448) a
short run is trained on the built-in demo corpus into benchmarks/out/precision/<model>/ (reused
when present) with interval checkpoints. At its initial, middle and final checkpoint the seen case
is measured end to end (S_v noise batches, S_r Rademacher directions, the same seed) in float64
and in each mode: float32 (IEEE), float32 + TF32 (CUDA only), bf16 autocast. Each statistic's
relative error |x − x₆₄| / |x₆₄| is reported. The largest Hessian eigenvalue from Lanczos (12 steps) is
compared too: float64 operator and basis against the mode's operator with a float64 basis and
with a bf16 basis and float32 reductions. Writes benchmarks/out/precision-<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tiny_llm.config import config_from_dict, config_to_dict, load_config
from tiny_llm.curvature.hessian import EpochHessian, Precision, runtime_settings
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.spectrum import Basis, top_eigenpairs
from tiny_llm.data.corpus import Source, default_capacity, prepare_source_cache
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.causal import count_parameters
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import train

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks/out"
STATISTICS = [
    "loss",
    "noise_curvature",
    "normalized_alignment",
    "random_curvature",
    "grad_curvature",
    "mean_noise_norm",
    "full_grad_norm",
    "b_simple",
    "b_noise",
]


def _run_config(name: str, folder: Path):
    demo = config_to_dict(load_config(REPO / "config/runs/demo.yaml"))
    demo["data"]["cache"] = str(folder / "cache")
    demo["training"]["checkpoint_policy"] = "interval"
    if name == "0.8M":
        demo["model"].update(d_model=128, n_layers=4, n_heads=4, d_ff=344, max_seq_len=128)
        demo["data"]["seq_len"] = 128
        demo["training"].update(tokens=4 * 8 * 16 * 128, lr=0.003)
    elif name != "demo":
        raise ValueError(f"--models: expected demo or 0.8M, got {name!r}")
    return config_from_dict(demo)


def _trained(name: str) -> tuple[object, Path]:
    folder = OUT / "precision" / name
    config = _run_config(name, folder)
    if not (folder / "cache").exists():
        prepare_source_cache(
            config.data, Source("demo"), capacity=default_capacity(config), out=folder / "cache", shard_tokens=1 << 20
        )
    train(config, folder / "run")
    return config, folder / "run"


def _model(config, path: Path, precision: Precision) -> Llama:
    from safetensors.torch import load_file

    model = Llama(config.model, attention_backend="reference")
    model.load_state_dict(load_file(path))
    return model.to(precision.device, precision.dtype)


def _modes(device: torch.device) -> dict[str, tuple[Precision, bool]]:
    """name -> (precision, TF32)."""
    modes = {"float32": (Precision(device, torch.float32), False)}
    if device.type == "cuda":
        modes["float32 + TF32"] = (Precision(device, torch.float32), True)
    modes["bf16 autocast" + (" + TF32" if device.type == "cuda" else "")] = (
        Precision(device, torch.float32, amp=True),
        device.type == "cuda",
    )
    return modes


def _measure(
    config, run: Path, checkpoint: str, precision: Precision, tf32: bool, samples: int, lanczos_steps: int
) -> dict:
    cache = TokenCache(config.data.cache)
    inputs = CaseInputs(
        cache=cache,
        plan=epoch_plan(config, 1),
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=8,
        noise_samples=samples,
        random_samples=samples,
        seed=42,
        engine="adjoint",
        directions_per_pass=16,
        compile=False,
    )
    model = _model(config, run / checkpoint, precision)
    with runtime_settings(precision.device, tf32):
        started = time.perf_counter()
        result = measure_case(model, inputs, precision, progress=lambda message: None)
        tokens = torch.cat([cache.tokens(b) for b in inputs.plan.blocks])
        values = {}
        for basis, reduction in ((torch.float64, torch.float64), (torch.bfloat16, torch.float32)):
            operator = EpochHessian(
                model, tokens, batch_size=8, engine="double_backward", precision=precision, directions_per_pass=1
            )
            top = top_eigenpairs(
                operator.hvp,
                operator.flat.D,
                1,
                lanczos_steps,
                seed=42,
                basis=Basis(basis, reduction, precision.device),
            )
            values[str(basis).removeprefix("torch.")] = float(top[0][0])
    return {
        **result["statistics"],
        "lambda_max": values["float64"],
        "lambda_max_bf16_basis": values["bfloat16"],
        "seconds": time.perf_counter() - started,
    }


CHECKPOINTS = ("initial", "middle", "final")


def _checkpoint(which: str, epochs: int) -> str:
    return f"epoch-{ {'initial': 0, 'middle': epochs // 2, 'final': epochs}[which]:03d}.safetensors"


def _errors(reference: dict, measured: dict) -> dict:
    errors = {}
    for key in STATISTICS + ["lambda_max"]:
        exact, value = reference.get(key), measured.get(key)
        errors[key] = None if exact in (None, 0) or value is None else abs(value - exact) / abs(exact)
    errors["lambda_max_bf16_basis"] = abs(measured["lambda_max_bf16_basis"] - reference["lambda_max"]) / abs(
        reference["lambda_max"]
    )
    return errors


def _write(rows: list[dict], device: torch.device, samples: int) -> str:
    """benchmarks/out/precision-<device>.{json,md} from the rows so far (after every checkpoint, so a
    run cut short keeps what it measured)."""
    columns = [
        "loss",
        "noise_curvature",
        "normalized_alignment",
        "random_curvature",
        "grad_curvature",
        "b_simple",
        "b_noise",
        "lambda_max",
        "lambda_max_bf16_basis",
    ]
    lines = ["| model | checkpoint | mode | " + " | ".join(columns) + " |", "|" + " --- |" * (3 + len(columns))]
    for row in rows:
        cells = ["–" if row["relative_error"][c] is None else f"{row['relative_error'][c]:.1e}" for c in columns]
        lines.append(
            f"| {row['model']} | {row['checkpoint'].split('.')[0]} | {row['mode']} | " + " | ".join(cells) + " |"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    label = "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device).replace(" ", "-")
    (OUT / f"precision-{label}.json").write_text(
        json.dumps({"device": label, "samples": samples, "rows": rows}, indent=1)
    )
    (OUT / f"precision-{label}.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="demo,0.8M")
    parser.add_argument(
        "--checkpoints",
        default=",".join(CHECKPOINTS),
        help=f"comma-separated, of {', '.join(CHECKPOINTS)} (default all three)",
    )
    parser.add_argument("--samples", type=int, default=8, help="S_v and S_r per measurement")
    parser.add_argument("--lanczos-steps", type=int, default=12, help="Lanczos steps for the largest eigenvalue")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    if unknown := [c for c in args.checkpoints.split(",") if c not in CHECKPOINTS]:
        raise SystemExit(f"--checkpoints: unknown {', '.join(unknown)}; choose from {', '.join(CHECKPOINTS)}")
    rows, table = [], ""
    for name in args.models.split(","):
        config, run = _trained(name)
        for checkpoint in (_checkpoint(c, config.training.epochs) for c in args.checkpoints.split(",")):
            reference = _measure(
                config, run, checkpoint, Precision(device, torch.float64), False, args.samples, args.lanczos_steps
            )
            print(f"{name} {checkpoint} float64 reference: {reference['seconds']:.0f} s", flush=True)
            for mode, (precision, tf32) in _modes(device).items():
                measured = _measure(config, run, checkpoint, precision, tf32, args.samples, args.lanczos_steps)
                errors = _errors(reference, measured)
                rows.append(
                    {
                        "model": name,
                        "parameters": count_parameters(_model(config, run / checkpoint, precision)),
                        "checkpoint": checkpoint,
                        "mode": mode,
                        "relative_error": errors,
                        "reference": reference,
                        "measured": measured,
                    }
                )
                print(
                    f"{name} {checkpoint} {mode}: "
                    + ", ".join(f"{k} {v:.1e}" for k, v in errors.items() if v is not None),
                    flush=True,
                )
            table = _write(rows, device, args.samples)
    print(table or "no checkpoint measured")


if __name__ == "__main__":
    main()
