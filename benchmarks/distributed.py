"""Memory, speed and communication of the curvature passes over several ranks (CPU, gloo).

Three measurements, each on ranks started here with ``torch.multiprocessing`` (one thread each):

* **memory per rank, sharded** (N = 1, 2, 4): a model of a few million parameters sharded with
  FSDP2 (``ShardedHessian``); per rank the bytes of its parameter shard, gradient shard, direction
  and Lanczos basis, and the peak of live storage (``StoragePeak``) created during a Lanczos run
  (basis, products, gradients, FSDP's gathered blocks, activations), beside the unsharded
  finite-difference engine in one process;
* **speed, data-parallel** (N = 1, 2): seconds per pass of K Hessian-vector products
  (double_backward) and of K quadratic forms (adjoint) over the same epoch, the micro-batches
  split over the ranks;
* **bytes per pass**: the payload of every collective a rank takes part in (all-reduce, FSDP's
  all-gather and reduce-scatter), counted by wrapping torch.distributed's functions.

    python benchmarks/distributed.py                 # everything (about 5 minutes on 2 cores)
    python benchmarks/distributed.py --json out.json # also the figures as JSON

Run it on an otherwise idle machine: the speed-up is a ratio of two runs on the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tiny_llm.config import ModelConfig
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.memory_measure import StoragePeak
from tiny_llm.curvature.sharded import ShardedHessian
from tiny_llm.curvature.spectrum import Basis, top_eigenpairs
from tiny_llm.model.llama import Llama

CPU32 = Precision(torch.device("cpu"), torch.float32)
_COUNTED = (
    "all_reduce",
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
)


def _count_collectives(counter: dict[str, int]) -> None:
    """Wrap torch.distributed's collectives to add each call's payload (bytes of the tensor a rank
    contributes or receives, whichever is larger) to ``counter``."""
    for name in _COUNTED:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def counted(*args, _original=original, _name=name, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
                v for v in kwargs.values() if isinstance(v, torch.Tensor)
            ]
            counter[_name] = counter.get(_name, 0) + max((t.numel() * t.element_size() for t in tensors), default=0)
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def _model(args: argparse.Namespace) -> Llama:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_layers=args.layers,
        max_seq_len=args.seq_len,
    )
    return Llama(config, attention_backend="reference")


def _tokens(args: argparse.Namespace, rows: int) -> torch.Tensor:
    return torch.randint(0, args.vocab, (rows, args.seq_len + 1), generator=torch.Generator().manual_seed(1))


def _memory_rank(rank: int, size: int, store: str, out: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        counter: dict[str, int] = {}
        op = ShardedHessian(_model(args), _tokens(args, args.memory_rows), batch_size=args.memory_rows, precision=CPU32)
        d = len(op.layout.indices)
        _count_collectives(counter)
        with StoragePeak() as peak:
            started = time.perf_counter()
            top_eigenpairs(
                op.hvp,
                op.D,
                1,
                args.lanczos_steps,
                basis=Basis(torch.float32, torch.float32, layout=op.layout),
            )
            seconds = time.perf_counter() - started
        products = args.lanczos_steps + 1
        record = {
            "ranks": size,
            "rank": rank,
            "D": op.D,
            "local_entries": d,
            "parameters_bytes": 4 * d,
            "gradient_bytes": 4 * d,
            "direction_bytes": 8 * d,
            "basis_bytes": 4 * d * args.lanczos_steps,
            "peak_bytes": peak.peak,
            "seconds_per_product": seconds / products,
            "bytes_per_product": {k: v / products for k, v in counter.items()},
        }
        Path(f"{out}.{rank}").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def _unsharded_memory(args: argparse.Namespace) -> dict:
    op = EpochHessian(
        _model(args),
        _tokens(args, args.memory_rows),
        batch_size=args.memory_rows,
        engine="finite_difference",
        precision=CPU32,
    )
    with StoragePeak() as peak:
        top_eigenpairs(op.hvp, op.flat.D, 1, args.lanczos_steps, basis=Basis(torch.float32, torch.float32))
    return {
        "ranks": 1,
        "sharded": False,
        "D": op.flat.D,
        "peak_bytes": peak.peak,
        "basis_bytes": 4 * op.flat.D * args.lanczos_steps,
    }


def _analysis_case(args: argparse.Namespace, folder: str):
    """A run's configuration and a token cache (random ids) for the benchmark's model; the seen
    epoch of ``args.analysis_batches`` batches of ``args.analysis_batch`` sequences."""
    import numpy as np

    from tiny_llm.config import config_from_dict
    from tiny_llm.data.preparation import Blocking, prepare_cache

    model = _model(args).config
    config = config_from_dict(
        {
            "model": model.__dict__,
            "training": {
                "batch_size": args.analysis_batch,
                "micro_batch_size": args.micro_batch,
                "tokens": args.analysis_batch * args.analysis_batches * args.seq_len,
                "epochs": 1,
                "attention_backend": "reference",
            },
            "data": {"cache": f"{folder}/cache", "seq_len": args.seq_len, "shuffle_group_blocks": 4, "seed": 3},
        }
    )
    blocks = args.analysis_batch * args.analysis_batches * 2
    ids = np.random.default_rng(5).integers(0, args.vocab, blocks * args.seq_len + 1)
    prepare_cache(
        f"{folder}/cache",
        [ids],
        tokenizer={"type": "external", "vocab_size": args.vocab},
        vocab_size=args.vocab,
        blocking=Blocking(
            seq_len=args.seq_len,
            shuffle_group_blocks=4,
            data_seed=3,
            prepare_train_tokens=blocks * args.seq_len,
            shard_blocks=64,
        ),
        source={"kind": "benchmark"},
    )
    return config


def _analysis_rank(rank: int, size: int, store: str, out: str, args: argparse.Namespace) -> None:
    """One rank of a sharded (state, case) analysis (``measure_case``, taylor engine): the peak of
    live storage created during it (the shards FSDP makes included), seconds and bytes per form
    pass, and the plan's predicted peak for one rank."""
    from tiny_llm.curvature.memory import JobShape, plan_analysis
    from tiny_llm.curvature.noise import CaseInputs, measure_case
    from tiny_llm.data.tokens import TokenCache, epoch_plan

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        config = _analysis_case(args, os.path.dirname(store)) if rank == 0 else None
        dist.barrier()
        if config is None:
            config = _analysis_case(args, os.path.dirname(store))  # the cache exists: reused
        inputs = CaseInputs(
            cache=TokenCache(config.data.cache),
            plan=epoch_plan(config, 1),
            micro_batch_size=args.micro_batch,
            hvp_batch_size=args.micro_batch,
            noise_samples=args.analysis_noise,
            random_samples=args.analysis_noise,
            seed=1,
            engine="taylor",
            directions_per_pass=args.K,
            compile=False,
            sharded=True,
        )
        counter: dict[str, int] = {}
        _count_collectives(counter)
        forms_bytes = {"moved": 0}
        from tiny_llm.curvature import hessian

        original = hessian.EpochHessian.split_quadratic_forms  # the one operator, sharded placement

        def counted(self, V, _original=original):
            before = sum(counter.values())
            try:
                return _original(self, V)
            finally:
                forms_bytes["moved"] += sum(counter.values()) - before

        hessian.EpochHessian.split_quadratic_forms = counted
        model = _model(args)
        with StoragePeak() as peak:
            result = measure_case(model, inputs, CPU32, progress=lambda message: None)
        plan = plan_analysis(
            JobShape(
                config=config.model,
                seq_len=args.seq_len,
                engine="taylor",
                K=args.K,
                hvp_batch_size=args.micro_batch,
                micro_batch_size=args.micro_batch,
                itemsize=4,
                compiled=False,
                shards=size,
            ),
            audit_directions=None,
            extra_vectors=0,
            budget_bytes=None,
        )
        passes = result["counts"]["hvp_passes"]
        forms = 2 * args.analysis_noise + 1
        Path(f"{out}.{rank}").write_text(
            json.dumps(
                {
                    "ranks": size,
                    "D": result["counts"]["parameters_D"],
                    "peak_bytes": peak.peak,
                    "predicted_bytes": plan.peak_bytes,
                    "forms": forms,
                    "passes": passes,
                    "seconds_per_form": result["timing"]["hvp_seconds"] / forms,
                    "bytes_per_form_pass": forms_bytes["moved"] / passes,
                    "total_seconds": result["timing"]["total_seconds"],
                    "noise_curvature": result["statistics"]["noise_curvature"],
                }
            )
        )
    finally:
        dist.destroy_process_group()


def _speed_rank(rank: int, size: int, store: str, out: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        counter: dict[str, int] = {}
        if size > 1:
            _count_collectives(counter)
        model, tokens = _model(args), _tokens(args, args.speed_rows)
        D = FlatParameters(model).D
        V = torch.randn(args.K, D, generator=torch.Generator().manual_seed(2))
        record = {"ranks": size, "D": D}
        for kind, engine, method in (("hvp", "double_backward", "hvp"), ("forms", "adjoint", "quadratic_forms")):
            op = EpochHessian(
                model, tokens, batch_size=args.micro_batch, engine=engine, precision=CPU32, directions_per_pass=args.K
            )
            getattr(op, method)(V[:1])  # warm-up
            counter.clear()
            times = []
            for _ in range(args.repeats):
                if size > 1:
                    dist.barrier()
                started = time.perf_counter()
                getattr(op, method)(V)
                times.append(time.perf_counter() - started)
            record[f"{kind}_seconds"] = min(times)
            record[f"{kind}_bytes"] = {k: v / args.repeats for k, v in counter.items() if k == "all_reduce"}
        Path(f"{out}.{rank}").write_text(json.dumps(record))
    finally:
        if size > 1:
            dist.destroy_process_group()


def _spawn(target, size: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        mp.start_processes(
            target, args=(size, os.path.join(tmp, "store"), out, args), nprocs=size, start_method="spawn"
        )
        return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--memory-rows", type=int, default=2, help="sequences of the memory measurement's epoch")
    parser.add_argument("--lanczos-steps", type=int, default=8)
    parser.add_argument("--speed-rows", type=int, default=16, help="sequences of the speed measurement's epoch")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("-K", type=int, default=4, help="directions per pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--analysis-batch", type=int, default=4, help="sequences per batch of the analysed epoch")
    parser.add_argument("--analysis-batches", type=int, default=4, help="batches of the analysed epoch")
    parser.add_argument("--analysis-noise", type=int, default=2, help="noise (and random) directions analysed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", choices=["analysis"], help="only the sharded analysis's table")
    args = parser.parse_args()

    MiB = 2**20
    if args.only == "analysis":
        results = {}
        _analysis_table(args, results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return
    results = {"unsharded": _unsharded_memory(args)}
    print(f"model: D = {results['unsharded']['D']:,} parameters; Lanczos {args.lanczos_steps} steps, float32")
    print(
        f"unsharded, one process: peak {results['unsharded']['peak_bytes'] / MiB:.1f} MiB "
        f"(basis {results['unsharded']['basis_bytes'] / MiB:.1f} MiB)"
    )
    print(
        "| ranks | entries per rank | parameters | gradient | direction | basis | peak per rank | s per HVP | "
        "all-gather per HVP | reduce-scatter per HVP | all-reduce per HVP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in (1, 2, 4):
        ranks = _spawn(_memory_rank, size, args)
        results[f"sharded_{size}"] = ranks
        worst = max(ranks, key=lambda r: r["peak_bytes"])
        moved = worst["bytes_per_product"]
        print(
            f"| {size} | {worst['local_entries']:,} | {worst['parameters_bytes'] / MiB:.1f} MiB | "
            f"{worst['gradient_bytes'] / MiB:.1f} MiB | {worst['direction_bytes'] / MiB:.1f} MiB | "
            f"{worst['basis_bytes'] / MiB:.1f} MiB | {worst['peak_bytes'] / MiB:.1f} MiB | "
            f"{worst['seconds_per_product']:.2f} | {moved.get('all_gather_single', 0) / MiB:.1f} MiB | "
            f"{moved.get('reduce_scatter_single', 0) / MiB:.1f} MiB | {moved.get('all_reduce', 0) / MiB:.3f} MiB |"
        )
    print()
    print("| ranks | s per HVP pass (K directions) | speed-up | s per form pass | speed-up | all-reduce per pass |")
    print("|---|---|---|---|---|---|")
    base = None
    for size in (1, 2):
        record = _spawn(_speed_rank, size, args)[0] if size > 1 else _speed_in_process(args)
        results[f"data_parallel_{size}"] = record
        base = base or record
        print(
            f"| {size} | {record['hvp_seconds']:.2f} | {base['hvp_seconds'] / record['hvp_seconds']:.2f}× | "
            f"{record['forms_seconds']:.2f} | {base['forms_seconds'] / record['forms_seconds']:.2f}× | "
            f"{record['hvp_bytes'].get('all_reduce', 0) / MiB:.2f} MiB (HVP), "
            f"{record['forms_bytes'].get('all_reduce', 0)} B (forms) |"
        )
    print()
    _analysis_table(args, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _analysis_table(args: argparse.Namespace, results: dict) -> None:
    """The sharded (state, case) analysis at N = 1, 2, 4: per-rank peak against the plan's."""
    MiB = 2**20
    print(
        f"sharded analysis (taylor, K = {args.K}, {2 * args.analysis_noise + 1} forms, epoch of "
        f"{args.analysis_batches} x {args.analysis_batch} sequences of {args.seq_len} tokens, float32)"
    )
    print("| ranks | peak per rank | predicted | predicted ÷ counted | s per form | moved per form pass |")
    print("|---|---|---|---|---|---|")
    for size in (1, 2, 4):
        ranks = _spawn(_analysis_rank, size, args)
        results[f"analysis_{size}"] = ranks
        worst = max(ranks, key=lambda r: r["peak_bytes"])
        print(
            f"| {size} | {worst['peak_bytes'] / MiB:.1f} MiB | {worst['predicted_bytes'] / MiB:.1f} MiB | "
            f"{worst['predicted_bytes'] / worst['peak_bytes']:.2f} | {worst['seconds_per_form']:.2f} | "
            f"{worst['bytes_per_form_pass'] / MiB:.1f} MiB |"
        )


def _speed_in_process(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        _speed_rank(0, 1, os.path.join(tmp, "store"), os.path.join(tmp, "out"), args)
        return json.loads(Path(os.path.join(tmp, "out.0")).read_text())


if __name__ == "__main__":
    main()
