"""Quadratic forms at the shapes of the checkpoints researchers study, side by side with the peers
(run on demand, not a test).

    .venv/bin/python benchmarks/real_shapes.py                      # gpt2-small and pythia-160m, 5 trials
    .venv/bin/python benchmarks/real_shapes.py --shapes 0.8M,demo   # the small shapes of hvp_cost.py
    python3 benchmarks/real_shapes.py --device cuda [--compile]     # the same table on a GPU (make gpu-check)
    make bench-peers                                                # installs the peers, then runs this

Each shape keeps a real checkpoint's width, heads, MLP and vocabulary with fewer layers (2) and
one sequence (T = 256): GPT-2 small (d 768, 12 heads, MLP 3072, V 50,257, tied head) and
Pythia-160M (GPT-NeoX: d 768, 12 heads, MLP 3072, V 50,304, rotary 25 %, untied head); the
demo and 0.8M Llama shapes of ``hvp_cost.py`` for comparison. Random weights (each model's own
initialisation) and tokens, CPU float32, one thread.

Every trial times a gradient pass (forward and backward of the token-mean loss) and right after it
each method's pass over the same tokens, so that every ratio (seconds per direction ÷ gradient
pass) pairs two measurements under the same load of this shared machine; the table gives the
median of the per-trial ratios and their range. Methods: ours (``adjoint`` and ``taylor`` quadratic
forms, ``double_backward`` products, through ``EpochHessian``), and the peers computing vᵀ(Hv) on
the same model and tokens: plain double backward (``torch.autograd.grad`` twice, what most tools
do), ``torch.func`` jvp of grad (forward over reverse), curvlinops 3.0.1 ``HessianLinearOperator``
and hessian-eigenthings 1.0.0a5 ``HessianOperator`` (autograd and finite-difference). Each method's
forms of the same 16 unit directions are checked against float64 (our adjoint engine on a float64
copy): the largest difference relative to the forms' root mean square, and the median. The exact
float32 HVPs (the double backwards, jvp of grad) show the float32 floor: the model's own rounding,
which no float32 method goes below. The peers are optional: one that is not installed is skipped with a note.

Memory: the peak live storage of one pass of the gradient and of adjoint K = 16 (``StoragePeak``),
with the head and loss in 64-token chunks and without.

On a GPU (``--device cuda``) the same table in float32 (TF32 off), each pass timed between two
synchronisations and memory as the allocator's peak (``torch.cuda.max_memory_allocated``); the
thread count does not apply. ``--compile`` adds our Pearlmutter product compiled with
``torch.compile`` at K = 1 and K = 16 (what the campaign's spectra run on CUDA) beside the eager
rows; the other engines and the peers stay eager, as they run in the product (on CPU it works too,
given a C++ compiler; the product compiles on CUDA only).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.func import functional_call, grad, jvp

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig, load_config
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.memory import GRADIENT, PassShape
from tiny_llm.curvature.memory_measure import measure_pass
from tiny_llm.model.causal import token_losses
from tiny_llm.runtime import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
COMPILED = (("pearlmutter", 1), ("pearlmutter", 16))
"""With --compile: our compiled Pearlmutter product (the campaign's spectra on CUDA)."""

SHAPES = {
    "gpt2-small": (
        ModelConfig(
            architecture="gpt2", vocab_size=50257, d_model=768, n_layers=2, n_heads=12, d_ff=3072, max_seq_len=256
        ),
        1,
    ),
    "pythia-160m": (
        ModelConfig(
            architecture="gpt_neox",
            vocab_size=50304,
            d_model=768,
            n_layers=2,
            n_heads=12,
            d_ff=3072,
            max_seq_len=256,
            rotary_pct=0.25,
            tie_embeddings=False,
        ),
        1,
    ),
    "nanogpt": (  # nanoGPT's default model (curvlinops' benchmark problem): 12 layers; 2 here (CPU)
        ModelConfig(
            architecture="gpt2",
            vocab_size=50304,
            d_model=768,
            n_layers=2,
            n_heads=12,
            d_ff=3072,
            max_seq_len=1024,
            tie_embeddings=False,
        ),
        4,
    ),
    "0.8M": (ModelConfig(vocab_size=256, d_model=128, n_layers=4, n_heads=4, d_ff=344, max_seq_len=128), 8),
    "demo": (load_config(REPO / "config/runs/demo.yaml").model, 8),
}
"""Shape -> (model, sequences per pass); T = max_seq_len."""

OURS = (("adjoint", 16), ("adjoint", 4), ("taylor", 1), ("taylor", 4), ("double_backward", 1))
FLOOR = {
    ("adjoint", 16): "3 products per linear layer and direction + (forward + reverse + primal)/K ≈ 1.04",
    ("adjoint", 4): "3 per direction + (forward + reverse + primal)/4 ≈ 1.17",
    ("taylor", 1): "5 products per linear layer (x1Wᵀ, x0Vᵀ, x1Vᵀ, x2Wᵀ and the primal) ≈ 1.67",
    ("taylor", 4): "4 per direction + the primal / 4 ≈ 1.42",
    ("double_backward", 1): "about 9 products (forward, backward, tangent forward and backward) ≈ 3",
}
"""The matmul floor per direction, in gradient passes (a gradient: 3 products per linear layer)."""


@dataclasses.dataclass(frozen=True)
class Chunks:
    """How a pass is cut: at most ``group_rows`` sequences at a time (the gradient too), the head and
    loss ``head_tokens`` positions at a time (None: whole); neither changes a number."""

    group_rows: int | None = None
    head_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class Tokens:
    """A pass's tokens: ``sequences`` rows of ``seq_len`` (None: the shape's own)."""

    sequences: int | None = None
    seq_len: int | None = None

    def of(self, name: str) -> tuple[ModelConfig, int]:
        config, sequences = SHAPES[name]
        if self.seq_len is not None:
            config = dataclasses.replace(config, max_seq_len=self.seq_len)
        return config, self.sequences or sequences


def _ours(
    model, tokens, engine: str, K: int, precision: Precision, chunks: Chunks = Chunks(), compile: bool = False
) -> Callable[[torch.Tensor], torch.Tensor]:
    operator = EpochHessian(
        model,
        tokens,
        batch_size=len(tokens),
        engine=engine,
        precision=precision,
        directions_per_pass=K,
        group_rows=chunks.group_rows,
        head_tokens=chunks.head_tokens,
        compile=compile,
    )
    return operator.quadratic_forms


def _loss(model, tokens: torch.Tensor) -> torch.Tensor:
    return token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()


def _double_backward(model, tokens) -> Callable[[torch.Tensor], torch.Tensor]:
    """vᵀ(Hv) by autograd twice: the gradient with its graph, then the gradient of ⟨g, v⟩."""
    params, flat = list(model.parameters()), FlatParameters(model)

    def forms(V: torch.Tensor) -> torch.Tensor:
        out = []
        for v in V:
            g = torch.autograd.grad(_loss(model, tokens), params, create_graph=True)
            blocks = flat.blocks(v.unsqueeze(0))
            Hv = torch.autograd.grad(sum((a * b.view_as(a)).sum() for a, b in zip(g, blocks, strict=True)), params)
            out.append(flat.flatten([h.detach() for h in Hv]).double() @ v.double())
        return torch.stack(out)

    return forms


def _jvp_of_grad(model, tokens) -> Callable[[torch.Tensor], torch.Tensor]:
    """vᵀ(Hv) by torch.func: jvp of grad (forward over reverse)."""
    names = [n for n, _ in model.named_parameters()]
    primals = tuple(p.detach() for p in model.parameters())
    flat = FlatParameters(model)

    def loss(*values):
        return _loss(lambda x: functional_call(model, dict(zip(names, values, strict=True)), (x,)), tokens)

    def forms(V: torch.Tensor) -> torch.Tensor:
        out = []
        for v in V:
            tangents = tuple(b.view_as(p) for b, p in zip(flat.blocks(v.unsqueeze(0)), primals, strict=True))
            _, Hv = jvp(grad(loss, argnums=tuple(range(len(primals)))), primals, tangents)
            out.append(flat.flatten(list(Hv)).double() @ v.double())
        return torch.stack(out)

    return forms


class _Flat(torch.nn.Module):
    """The model with its logits as (tokens, vocabulary) rows, as curvlinops' CrossEntropyLoss wants."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        logits = self.model(x)
        return logits.reshape(-1, logits.size(-1))


def _curvlinops(model, tokens, operator: str = "HessianLinearOperator") -> Callable[[torch.Tensor], torch.Tensor]:
    import curvlinops

    wrapped = _Flat(model)
    data = [(tokens[:, :-1], tokens[:, 1:].reshape(-1))]
    H = getattr(curvlinops, operator)(
        wrapped,
        torch.nn.CrossEntropyLoss(reduction="mean"),
        list(model.parameters()),
        data,
        check_deterministic=False,
        progressbar=False,
    )
    return lambda V: torch.stack([(H @ v).double() @ v.double() for v in V])


def _eigenthings(model, tokens, method: str) -> Callable[[torch.Tensor], torch.Tensor]:
    from hessian_eigenthings import HessianOperator

    H = HessianOperator(model, [tokens], lambda m, batch: _loss(m, batch), method=method)
    return lambda V: torch.stack([H.matvec(v).double() @ v.double() for v in V])


PEERS = {
    "plain double backward": (_double_backward, None),
    "torch.func jvp(grad)": (_jvp_of_grad, None),
    "curvlinops 3.0.1 HessianLinearOperator": (_curvlinops, "curvlinops"),
    "curvlinops 3.0.1 GGNLinearOperator (vᵀGv only)": (
        lambda m, t: _curvlinops(m, t, "GGNLinearOperator"),
        "curvlinops",
    ),
    "hessian-eigenthings 1.0.0a5 (autograd)": (lambda m, t: _eigenthings(m, t, "autograd"), "hessian_eigenthings"),
    "hessian-eigenthings 1.0.0a5 (finite difference)": (
        lambda m, t: _eigenthings(m, t, "finite_difference"),
        "hessian_eigenthings",
    ),
}


def _seconds(fn, device: torch.device) -> float:
    """Wall seconds of fn(), between two synchronisations on CUDA (its kernels finished)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _available(module: str | None) -> bool:
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def problem(
    name: str, device: torch.device = CPU, size: Tokens = Tokens()
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A shape's float32 model (its own seeded initialisation), tokens and the 16 unit directions
    every method is checked on (unit: the finite-difference steps are absolute), on ``device``
    (drawn on the CPU: the same on every device)."""
    config, sequences = size.of(name)
    torch.manual_seed(0)
    model = build_model(config).float()
    tokens = torch.randint(
        0, config.vocab_size, (sequences, config.max_seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    directions = torch.randn(16, FlatParameters(model).D, generator=torch.Generator().manual_seed(2))
    directions = directions / directions.norm(dim=1, keepdim=True)
    return model.to(device), tokens.to(device), directions.to(device)


@dataclasses.dataclass(frozen=True)
class Options:
    """What a table measures beyond the shape: trials, the peers, the memory passes, the device,
    the compiled rows, the tokens and how a pass is cut."""

    trials: int = 5
    peers: bool = True
    memory: bool = True
    device: torch.device = CPU
    compile: bool = False
    size: Tokens = Tokens()
    chunks: Chunks = Chunks()


def measure_shape(name: str, options: Options = Options()) -> dict:
    device, chunks = options.device, options.chunks
    config, sequences = options.size.of(name)
    model, tokens, directions = problem(name, device, options.size)
    flat = FlatParameters(model)
    reference = EpochHessian(  # float64 forms, and their Gauss–Newton parts for the GGN operators
        copy.deepcopy(model).double(),
        tokens,
        batch_size=len(tokens),
        engine="adjoint",
        precision=Precision(device, torch.float64),
        directions_per_pass=16,
        group_rows=chunks.group_rows,
        head_tokens=64,
    )
    exact_forms, exact_parts = reference.split_quadratic_forms(directions.double())
    del reference

    float32 = Precision(device, torch.float32)
    methods: dict[str, tuple[Callable, int]] = {
        f"ours: {engine} K={K}": (_ours(model, tokens, engine, K, float32, chunks), K) for engine, K in OURS
    }
    if options.compile:
        for engine, K in COMPILED:
            methods[f"ours: {engine} K={K}, compiled"] = (
                _ours(model, tokens, engine, K, float32, chunks, compile=True),
                K,
            )
    skipped = []
    if options.peers:
        for label, (make, module) in PEERS.items():
            if _available(module):
                methods[label] = (make(model, tokens), 1)
            else:
                skipped.append(label)

    def gradient() -> None:  # forward and backward of the token-mean loss, as the engines' passes are timed
        for rows in tokens.split(chunks.group_rows or len(tokens)):  # a group's share of the mean
            (_loss(model, rows) * (len(rows) / len(tokens))).backward()
        model.zero_grad(set_to_none=True)

    accuracy = {}
    for label, (forms, _) in methods.items():  # warm-up, and each method's forms against float64
        exact = exact_parts if "GGN" in label else exact_forms  # vᵀGv against the float64 parts
        rms = float(exact.square().mean().sqrt())
        errors = (forms(directions).double() - exact).abs() / rms  # the same 16 directions for every method
        accuracy[label] = (float(errors.max()), float(errors.median()))
        print(f"  {name}: {label} checked against float64", file=sys.stderr, flush=True)
    gradient()
    ratios = {label: [] for label in methods}
    gradient_seconds = []
    for trial in range(options.trials):
        for label, (forms, K) in methods.items():
            g = _seconds(gradient, device)
            q = _seconds(lambda forms=forms, K=K: forms(directions[:K]), device)
            gradient_seconds.append(g)
            ratios[label].append(q / K / g)
        print(f"  {name}: trial {trial + 1}/{options.trials}", file=sys.stderr, flush=True)
    rows = [
        {
            "method": label,
            "per_direction_over_gradient": statistics.median(r),
            "range": [min(r), max(r)],
            "relative_error_float32": accuracy[label][0],
            "relative_error_float32_median": accuracy[label][1],
        }
        for label, r in ratios.items()
    ]
    result = {
        "parameters_D": flat.D,
        "tokens": sequences * config.max_seq_len,
        "sequences": sequences,
        "seq_len": config.max_seq_len,
        "group_rows": chunks.group_rows,
        "head_tokens": chunks.head_tokens,
        "gradient_seconds_median": statistics.median(gradient_seconds),
        "rows": rows,
        "skipped": skipped,
    }
    if options.memory:
        result["peak_memory_gib"] = {
            f"{what} K={K}{'' if head is None else f' head {head}'}": measure_pass(
                PassShape(
                    engine=what, config=config, rows=sequences, K=K, seq_len=config.max_seq_len, head_tokens=head
                ),
                device=device,
            )
            / 2**30
            for what, K in ((GRADIENT, 1), ("adjoint", 16))
            for head in (None, 64)
        }
    return result


def _print(name: str, result: dict, device: torch.device) -> None:
    print(
        f"\n### {name} (D = {result['parameters_D']:,}, {result['tokens']} tokens; gradient pass "
        f"{result['gradient_seconds_median']:.2f} s)\n"
    )
    print(
        "| method | per direction ÷ gradient (median, range) "
        "| float32 vs float64, 16 directions (÷ RMS of the forms): max | median |"
    )
    print("| --- | ---: | ---: | ---: |")
    for row in result["rows"]:
        low, high = row["range"]
        print(
            f"| {row['method']} | {row['per_direction_over_gradient']:.2f} ({low:.2f}–{high:.2f}) "
            f"| {row['relative_error_float32']:.1e} | {row['relative_error_float32_median']:.1e} |"
        )
    for label in result["skipped"]:
        print(f"| {label} | not installed (make bench-peers) | | |")
    if "peak_memory_gib" in result:
        print(
            f"\n{'peak live storage' if device.type == 'cpu' else 'allocator peak'} of one pass (GiB): "
            + ", ".join(f"{k} {v:.2f}" for k, v in result["peak_memory_gib"].items())
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="gpt2-small,pythia-160m", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--trials", type=int, default=5, help="paired trials (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also our Pearlmutter product compiled (torch.compile; on CPU it needs a C++ compiler)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    parser.add_argument("--no-peers", action="store_true", help="only our engines")
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave glibc's allocator as it is (default: keep freed memory, as tiny-llm's commands do)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory passes")
    parser.add_argument("--sequences", type=int, help="sequences per pass (default: the shape's own, 1 or 8)")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: the shape's own, 256 or 128)")
    parser.add_argument(
        "--group-rows", type=int, help="at most this many sequences at a time, the gradient too (default: all)"
    )
    parser.add_argument("--head-tokens", type=int, help="the head and loss this many positions at a time")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/out/real_shapes.json", help="the report (JSON), after each shape"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available here")
    if unknown := [name for name in args.shapes.split(",") if name not in SHAPES]:
        sys.exit(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if not args.glibc_defaults:
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 as it is, on every device
    report = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": args.threads if device.type == "cpu" else None,
        "shapes": {},
    }
    for name in args.shapes.split(","):
        options = Options(
            args.trials,
            not args.no_peers,
            not args.no_memory,
            device,
            args.compile,
            Tokens(args.sequences, args.seq_len),
            Chunks(args.group_rows, args.head_tokens),
        )
        report["shapes"][name] = measure_shape(name, options)
        _print(name, report["shapes"][name], device)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
