"""FSDP-sharded curvature on 2 and 3 CPU ranks (gloo): shard-local finite-difference products,
quadratic forms, exact forms by the Taylor mode block by block (every architecture), the
gradient, Lanczos (float64 and a bf16 basis), SLQ, CG and the block-diagonal error on sharded
vectors, against the dense float64 Hessian and the single-process engines."""

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from oracles import TINY_MODEL, dense_directions, dense_model, dense_tokens

from tiny_llm.curvature.engines import sharded_names
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.sharded import ShardedHessian, shard_layout
from tiny_llm.curvature.spectrum import (
    Basis,
    Layout,
    block_diagonal_error,
    conjugate_gradient,
    layer_blocks,
    slq,
    top_eigenpairs,
)
from tiny_llm.model.causal import token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)


_model, _tokens, _directions = dense_model, dense_tokens, dense_directions  # the dense problem's


def _measure(op, layout, D: int, damping: float, spectra: bool) -> dict:
    """What a spectrum job computes, on whatever vectors ``layout`` says this process holds: the
    products, forms and gradient; with ``spectra`` also Lanczos, SLQ, CG and the block errors."""
    V = layout.local(_directions(D))
    out = {
        "indices": layout.indices,
        "hvp": op.hvp(V),
        "forms": op.quadratic_forms(V),
        "gradient": op.gradient() if hasattr(op, "layout") else None,
    }
    if not spectra:
        return out
    values, vectors, residuals, _ = top_eigenpairs(op.hvp, D, 3, 40, seed=4, basis=Basis(layout=layout))
    low, *_ = top_eigenpairs(op.hvp, D, 3, 20, seed=4, basis=Basis(torch.bfloat16, torch.float32, layout=layout))
    nodes = slq(op.hvp, D, 2, 6, seed=5, basis=Basis(layout=layout))
    blocks = block_diagonal_error(op.hvp, V[:2], layer_blocks(FlatParameters(_model())), layout=layout)
    x = conjugate_gradient(op.hvp, V[0], damping, rtol=1e-10, layout=layout)[0]
    return {
        **out,
        "values": values,
        "vectors": vectors,
        "residuals": residuals,
        "bf16 values": low,
        "blocks": blocks,
        "slq": torch.stack([torch.cat(node) for node in nodes]),
        "cg": x,
    }


def _rank(rank: int, size: int, store: str, out: str, damping: float, engine: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        op = ShardedHessian(_model(), _tokens(), batch_size=2, precision=CPU64, engine=engine)
        measured = _measure(op, op.layout, op.D, damping, spectra=size == 2)
        for forms in sharded_names("forms"):  # every exact sharded forms engine of the registry
            exact = ShardedHessian(_model(), _tokens(), batch_size=2, precision=CPU64, engine=forms)
            measured[forms] = exact.split_quadratic_forms(exact.layout.local(_directions(op.D)))
        torch.save(measured, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _gather(parts: list[dict], key: str, D: int) -> torch.Tensor:
    """The full vectors from every rank's shards (each entry appears on exactly one rank)."""
    first = parts[0][key]
    full = torch.full((*first.shape[:-1], D), float("nan"), dtype=first.dtype)
    for part in parts:
        full[..., part["indices"]] = part[key]
    assert not full.isnan().any()
    return full


def test_the_layout_is_fsdp_row_chunks():
    shapes = [torch.Size([5, 2]), torch.Size([3]), torch.Size([1, 4])]
    parts = [shard_layout(shapes, rank, 3).indices.tolist() for rank in range(3)]
    assert parts == [[0, 1, 2, 3, 10, 13, 14, 15, 16], [4, 5, 6, 7, 11], [8, 9, 12]]
    assert sorted(sum(parts, [])) == list(range(17))


@pytest.mark.parametrize("engine", sharded_names("products"))
@pytest.mark.parametrize("ranks", [pytest.param(2, marks=pytest.mark.slow), 3])  # make test: 3 ranks (uneven)
def test_sharded_curvature_is_each_engine_on_shards(tmp_path, dense_problem, ranks, engine):
    """Every engine the registry runs sharded: its products (and spectra) those of the same engine in
    one process, and every sharded forms engine's exact forms and Gauss–Newton parts."""
    model, tokens, H = dense_problem
    assert torch.equal(tokens, _tokens())
    D = H.shape[0]
    damping = 2 * float(torch.linalg.eigvalsh(H).abs().max())  # H + λI positive definite
    unsharded = EpochHessian(_model(), _tokens(), batch_size=2, engine=engine, precision=CPU64)
    single = _measure(unsharded, Layout(D), D, damping, spectra=ranks == 2)
    mp.start_processes(
        _rank,
        args=(ranks, str(tmp_path / "store"), str(tmp_path / "out"), damping, engine),
        nprocs=ranks,
        start_method="spawn",
    )
    parts = [torch.load(tmp_path / f"out.{rank}", weights_only=True) for rank in range(ranks)]
    assert sorted(torch.cat([p["indices"] for p in parts]).tolist()) == list(range(D))  # each entry once

    V = _directions(D)
    exact = V @ H
    hvp = _gather(parts, "hvp", D)
    # the same products as the single-process engine, to rounding of the differences ...
    assert float((hvp - single["hvp"]).abs().max()) <= 1e-9 * float(single["hvp"].abs().max())
    # ... so within the finite-difference error of that engine against the dense Hessian
    fd_error = float((single["hvp"] - exact).abs().max())
    assert float((hvp - exact).abs().max()) <= 2 * fd_error + 1e-12 and fd_error < 1e-7 * float(exact.abs().max())
    forms = (V * exact).sum(1)
    for part in parts:  # every rank holds the reduced scalars
        torch.testing.assert_close(part["forms"], forms, rtol=1e-7, atol=0)
        torch.testing.assert_close(part["forms"], single["forms"], rtol=1e-9, atol=0)

    # exact forms and their Gauss–Newton parts on shards: those of the same engine in one process
    assert sharded_names("forms")
    for name in sharded_names("forms"):
        one = EpochHessian(_model(), _tokens(), batch_size=2, engine=name, precision=CPU64, directions_per_pass=3)
        split = one.split_quadratic_forms(V)
        for part in parts:
            torch.testing.assert_close(part[name], split, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(part[name][0], forms, rtol=1e-10, atol=0)

    flat = FlatParameters(model)
    model.zero_grad()
    token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean().backward()
    g = flat.flatten([p.grad for p in model.parameters()])
    model.zero_grad()
    torch.testing.assert_close(_gather(parts, "gradient", D), g, rtol=1e-12, atol=1e-15)  # the epoch gradient
    if ranks != 2:  # 3 ranks: uneven shards and micro-batches for the products; the spectra at 2
        return

    # Lanczos on shards: the dense top eigenpairs, as unsharded; a bf16 basis with float32 reductions too
    top = torch.linalg.eigvalsh(H).flip(0)[:3]
    for part in parts:
        torch.testing.assert_close(part["values"], top, rtol=1e-7, atol=0)
        torch.testing.assert_close(part["values"], single["values"], rtol=1e-9, atol=0)
        torch.testing.assert_close(part["bf16 values"], top, rtol=1e-2, atol=0)
        torch.testing.assert_close(part["residuals"], single["residuals"], rtol=1e-3, atol=1e-9)
        torch.testing.assert_close(part["slq"], single["slq"], rtol=1e-7, atol=1e-9)
        for key in ("relative_error", "cosine"):
            torch.testing.assert_close(part["blocks"][key], single["blocks"][key], rtol=1e-8, atol=1e-12)
    vectors = _gather(parts, "vectors", D)
    torch.testing.assert_close((vectors @ H * vectors).sum(1), top, rtol=1e-7, atol=0)

    # CG on shards solves (H + λI)x = b as the dense solve does
    b = V[0]
    x = _gather(parts, "cg", D)
    dense = torch.linalg.solve(H + damping * torch.eye(D, dtype=torch.float64), b)
    assert float((x - dense).norm()) <= 1e-6 * float(dense.norm())


def _taylor_rank(rank: int, size: int, store: str, out: str, architecture: str, engine: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        model = _architecture_model(architecture)
        op = ShardedHessian(model, _tokens(), batch_size=2, precision=CPU64, engine=engine)
        forms = op.split_quadratic_forms(op.layout.local(_directions(op.D)))
        grouped = ShardedHessian(  # a group of one sequence, the head 4 target positions at a time
            _architecture_model(architecture),
            _tokens(),
            batch_size=2,
            precision=CPU64,
            engine=engine,
            group_rows=1,
            head_tokens=4,
        )
        torch.save(
            {"taylor": forms, "grouped": grouped.split_quadratic_forms(grouped.layout.local(_directions(op.D)))},
            f"{out}.{rank}",
        )
    finally:
        dist.destroy_process_group()


def _architecture_model(architecture: str):
    from tiny_llm.architectures import build_model

    torch.manual_seed(0)
    config = dataclasses.replace(TINY_MODEL, architecture=architecture, tie_embeddings=architecture != "gpt_neox")
    return build_model(config).double()


@pytest.mark.parametrize("engine", sharded_names("forms"))
@pytest.mark.parametrize("architecture", ["gpt2", "gpt_neox"])
def test_exact_sharded_forms_on_the_other_architectures(tmp_path, architecture, engine):
    """GPT-2 (learned positions, LayerNorm, tied head) and GPT-NeoX (parallel residual, untied
    head) on 2 ranks: each sharded forms engine's forms and Gauss–Newton parts are those of the
    same engine in one process, to 1e-12."""
    D = FlatParameters(_architecture_model(architecture)).D
    V = _directions(D)
    single = EpochHessian(
        _architecture_model(architecture),
        _tokens(),
        batch_size=2,
        engine=engine,
        precision=CPU64,
        directions_per_pass=3,
    ).split_quadratic_forms(V)
    mp.start_processes(
        _taylor_rank,
        args=(2, str(tmp_path / "store"), str(tmp_path / "out"), architecture, engine),
        nprocs=2,
        start_method="spawn",
    )
    for rank in range(2):
        part = torch.load(tmp_path / f"out.{rank}", weights_only=True)
        torch.testing.assert_close(part["taylor"], single, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(part["grouped"], single, rtol=1e-12, atol=1e-14)
