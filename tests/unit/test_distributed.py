"""Data-parallel passes: 2 and 3 CPU ranks (gloo, a file rendezvous) give the single-process
quadratic forms, Hessian-vector products, Gauss–Newton split, mean gradient and loss in float64
(an uneven number of micro-batches and a padded last one included)."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.noise import mean_gradient_and_loss
from tiny_llm.distributed import is_writer, shard, world
from tiny_llm.model.llama import Llama

from conftest import TINY_MODEL

CPU64 = Precision(torch.device("cpu"), torch.float64)


def _measure() -> dict[str, torch.Tensor]:
    """Every reduced quantity on the float64 TINY_MODEL: 7 sequences in micro-batches of 3 (the last
    padded), 5 directions in passes of 2."""
    torch.manual_seed(0)
    model = Llama(TINY_MODEL, attention_backend="reference").double()
    tokens = torch.randint(0, 16, (7, 7), generator=torch.Generator().manual_seed(2))
    V = torch.randn(5, FlatParameters(model).D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = {}
    for engine in ("adjoint", "double_backward"):
        op = EpochHessian(model, tokens, batch_size=3, engine=engine, precision=CPU64, directions_per_pass=2)
        out[f"{engine} forms"] = op.quadratic_forms(V)
    out["split"] = EpochHessian(model, tokens, batch_size=3, engine="taylor", precision=CPU64,
                                directions_per_pass=2).split_quadratic_forms(V)
    out["hvp"] = EpochHessian(model, tokens, batch_size=3, engine="pearlmutter", precision=CPU64,
                              directions_per_pass=2).hvp(V)
    batches = [tokens[i:i + 2] for i in range(0, 7, 2)]  # 4 batches, the last of 1 sequence
    g, loss = mean_gradient_and_loss(model, FlatParameters(model), batches, 2, CPU64)
    out["gradient"], out["loss"] = g, torch.tensor(loss, dtype=torch.float64)
    return out


def _rank(rank: int, size: int, store: str, results: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        assert world() == (rank, size) and is_writer() == (rank == 0)
        assert shard(list(range(7))) == list(range(rank, 7, size))
        torch.save(_measure(), f"{results}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_give_the_single_process_numbers(tmp_path, ranks):
    single = _measure()
    assert world() == (0, 1) and is_writer()
    mp.start_processes(_rank, args=(ranks, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=ranks,
                       start_method="spawn")
    for rank in range(ranks):  # every rank holds the same numbers
        parallel = torch.load(tmp_path / f"out.{rank}", weights_only=True)
        for name, value in single.items():
            scale = float(value.abs().max())
            assert float((parallel[name] - value).abs().max()) <= 1e-12 * scale, (name, rank)
