"""The Hessian-vector-product engines (double_backward, pearlmutter, finite_difference) through the
operator: products against the dense float64 Hessian, finite differences refused under bf16
autocast, the compiled Pearlmutter product equal to the eager one."""

import pytest
import torch
from oracles import EXACT_PRODUCT_ENGINES

from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("engine", EXACT_PRODUCT_ENGINES)
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
def test_hvp_equals_dense_hessian(dense_problem, engine, K, batch_size):
    model, tokens, H = dense_problem
    V = torch.randn(5, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == 2 * -(-5 // K)
    assert op.n_targets == 7 * 6 and all(len(x) == batch_size for x, _ in op.batches)


def test_finite_differences_refuse_bf16_autocast(dense_problem):
    """Under bf16 autocast two gradients 2ε apart differ by the forward's rounding, not only by
    2εHv: the forms by differences miss by a tenth of their own size or more, ten times the exact
    engines' error under the same autocast, so the operator refuses the combination by name."""
    model, tokens, H = dense_problem
    model32 = Llama(model.config, attention_backend="reference")
    model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    V = torch.randn(4, H.shape[0], generator=torch.Generator().manual_seed(9))
    exact = ((V.double() @ H) * V.double()).sum(1)
    amp = Precision(torch.device("cpu"), torch.float32, amp=True)
    with pytest.raises(ValueError, match=r"finite differences: under bf16 autocast \(amp\)"):
        EpochHessian(model32, tokens, batch_size=4, engine="finite_difference", precision=amp)
    errors = {}
    for engine in ("finite_difference", "double_backward"):
        op = EpochHessian(
            model32, tokens, batch_size=4, engine=engine, precision=Precision(torch.device("cpu"), torch.float32)
        )
        op.context.precision = amp  # for finite differences, what the refusal prevents
        errors[engine] = float((op.quadratic_forms(V).double() - exact).abs().max() / exact.pow(2).mean().sqrt())
    assert errors["finite_difference"] > max(0.1, 10 * errors["double_backward"]), errors


@pytest.mark.slow
def test_compiled_pearlmutter_equals_eager_with_one_graph_per_direction_count(dense_problem):
    """torch.compile of vmap(jvp(grad)) (the CUDA default), here on CPU inductor: the products and
    forms of the eager engine, one graph for K directions whatever the micro-batch (the padded
    last included) and the epoch's target count, one more for single directions, none after."""
    model, tokens, H = dense_problem
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def graphs(rows: int) -> tuple[EpochHessian, int]:
        """An operator on the first ``rows`` rows, compiled from scratch, and its graphs for K directions."""
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        op = EpochHessian(
            model,
            tokens[:rows],
            batch_size=3,
            engine="pearlmutter",
            precision=CPU64,
            directions_per_pass=2,
            compile=True,
        )
        op.hvp(V)
        return op, torch._dynamo.utils.counters["stats"]["unique_graphs"]

    _, unpadded = graphs(6)  # micro-batches of 3 and 3
    compiled, padded = graphs(7)  # 3, 3 and 1 + 2 padding rows
    assert unpadded >= 1 and padded == unpadded  # the padded micro-batch reuses the graph
    torch.testing.assert_close(compiled.hvp(V), V @ H, rtol=0, atol=1e-10)
    torch._dynamo.utils.counters.clear()
    torch.testing.assert_close(compiled.hvp(V[:1]), V[:1] @ H, rtol=0, atol=1e-10)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the single-direction graph
    torch._dynamo.utils.counters.clear()
    compiled.hvp(V)
    compiled.hvp(V[:1])
    compiled.hvp(V[:3])  # a short chunk: padded to K
    eager = EpochHessian(model, tokens, batch_size=3, engine="pearlmutter", precision=CPU64, directions_per_pass=2)
    torch.testing.assert_close(compiled.quadratic_forms(V), eager.quadratic_forms(V), rtol=1e-12, atol=0)
    compiled.context.n_targets_tensor.fill_(2.0 * compiled.n_targets)  # another epoch's target count: an input
    torch.testing.assert_close(compiled.hvp(V), V @ H / 2, rtol=0, atol=1e-10)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # no recompilation
