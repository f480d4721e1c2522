"""The one pass loop under every placement: a test-only engine (a trivial per-micro-batch form,
registered here and nowhere else) runs unchanged on one process, on data-parallel ranks and on a
model sharded over 2 and 3 ranks (gloo); an engine is refused by name under a placement it does not
declare; a shift of θ is restored bit for bit; a sharded rank's dealing is padded."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from oracles import dense_directions, dense_model, dense_tokens

from tiny_llm.curvature import engines as registry
from tiny_llm.curvature.engines import Engine
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.curvature.placement import PLACEMENTS, Placement, Sharded, place
from tiny_llm.curvature.sharded import ShardedHessian
from tiny_llm.curvature.vectors import Layout
from tiny_llm.model.causal import IGNORE_INDEX, token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)


def directional(hessian, V, inputs, targets):
    """The test engine: vᵀ∇L_b (a linear form, whose sum over micro-batches is vᵀḡ), in the (2, K)
    shape of a forms engine, through nothing but the operator's gradient at θ."""
    g = hessian.gradient_at(inputs, targets)
    return torch.stack([(V.double() * g.double()).sum(1), torch.zeros(len(V), dtype=torch.float64)])


TEST_ENGINE = Engine(
    "directional", "forms", "test only", f"{__name__}:directional", placements=PLACEMENTS, gauss_newton=True
)


def _register() -> None:
    """In a rank's own process: the test engine beside the registry's."""
    registry.ENGINES.setdefault(TEST_ENGINE.name, TEST_ENGINE)


_model, _tokens, _directions = dense_model, dense_tokens, dense_directions  # the dense problem's


def _exact() -> torch.Tensor:
    """vᵀḡ for the three directions, ḡ the epoch's token-mean gradient by plain autograd."""
    model, tokens = _model(), _tokens()
    token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean().backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return _directions(len(g)) @ g


def _rank(rank: int, size: int, store: str, out: str, sharded: bool) -> None:
    torch.set_num_threads(1)
    _register()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        kind = ShardedHessian if sharded else EpochHessian
        op = kind(_model(), _tokens(), batch_size=2, precision=CPU64, engine="directional", directions_per_pass=2)
        V = op.placement.layout.local(_directions(op.flat.D))
        forms = op.split_quadratic_forms(V)[0]
        torch.save({"forms": forms, "passes": op.passes, "placement": op.placement.name}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("ranks", "sharded"), [(2, False), (2, True), (3, True)])
def test_a_test_engine_runs_unchanged_under_every_placement(tmp_path, ranks, sharded, monkeypatch):
    monkeypatch.setitem(registry.ENGINES, TEST_ENGINE.name, TEST_ENGINE)  # this test's only
    whole = EpochHessian(_model(), _tokens(), batch_size=2, precision=CPU64, engine="directional")
    exact = _exact()
    assert whole.placement.name == "whole"
    torch.testing.assert_close(whole.split_quadratic_forms(_directions(whole.flat.D))[0], exact, rtol=1e-12, atol=0)
    mp.start_processes(
        _rank, args=(ranks, str(tmp_path / "store"), str(tmp_path / "out"), sharded), nprocs=ranks, start_method="spawn"
    )
    for rank in range(ranks):
        part = torch.load(tmp_path / f"out.{rank}", weights_only=True)
        assert part["placement"] == ("sharded" if sharded else "data_parallel")
        assert part["passes"] == 2  # 3 directions, 2 per pass
        torch.testing.assert_close(part["forms"], exact, rtol=1e-12, atol=1e-15)


def test_an_engine_is_refused_by_name_under_a_placement_it_does_not_declare(monkeypatch):
    only = Engine("whole_only", "forms", "test only", f"{__name__}:directional", placements=("whole",))
    monkeypatch.setitem(registry.ENGINES, only.name, only)
    model = _model()
    placement = Placement(model, Layout(sum(p.numel() for p in model.parameters())), rank=0, ranks=2)
    with pytest.raises(ValueError, match="engine whole_only does not run under the data_parallel placement"):
        EpochHessian(model, _tokens(), batch_size=2, precision=CPU64, engine="whole_only", placement=placement)
    with pytest.raises(ValueError, match="engine adjoint does not run on a sharded model; .*taylor"):
        registry.engine("adjoint").check_placement("sharded")


def test_a_shift_is_restored_bit_for_bit_and_a_sharded_rank_takes_a_padded_micro_batch():
    model = _model()
    placement = place(model)  # no process group: whole, whatever was asked
    assert place(_model(), sharded=True).name == "whole"
    before = [p.detach().clone() for p in model.parameters()]
    step = torch.randn(placement.layout.D, dtype=torch.float64) * 1e-3
    with placement.shifted(step):
        moved = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.equal(moved, torch.cat([b.reshape(-1) for b in before]) + step)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    with pytest.raises(RuntimeError), placement.shifted(step):
        raise RuntimeError  # restored whatever happens
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))

    batches = [(torch.full((2, 3), i), torch.full((2, 3), i)) for i in range(5)]
    assert [int(x[0, 0]) for x, _ in Placement(model, placement.layout, 1, 2).deal(batches)] == [1, 3]
    padded = Sharded(model, placement.layout, 1, 2).deal(batches)  # 5 over 2 ranks: 3 rounds
    assert [int(x[0, 0]) for x, _ in padded] == [1, 3, 0] and bool((padded[-1][1] == IGNORE_INDEX).all())
