"""A float64 analysis of an adapter's model is float64: transformers' own float32 shortcuts (the
eager softmax, RMSNorm, the RoPE frequencies and angles) are lifted by the adapter's torch function
mode, with no patch of transformers (unlike hf_float64, which the native-import tests use). Tiny
GPT-NeoX and grouped-query Llama models (biases, llama3 RoPE scaling) made by transformers in
float64, read natively and through the adapter: the same logits and quadratic forms, and an
operation the mode cannot reach is recorded and refuses finite differences."""

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt): these tests never skip
from hf_models import CASES, hf_model, hf_tokens

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.gradients import gradient_rounding
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.model.adapter import HFCausalLM
from tiny_llm.model.hf import read_hf

CPU64 = Precision(torch.device("cpu"), torch.float64)
ADAPTER_ENGINES = ("double_backward", "pearlmutter", "finite_difference")


def _pair(path, case: str):
    """The native model and the adapter's, both float64, of one transformers checkpoint."""
    hf_model(path, CASES[case][0])
    config, state = read_hf(path)
    native = build_model(config).double()
    native.load_state_dict(state, strict=True)
    adapter = HFCausalLM(
        ModelConfig(
            architecture="hf",
            hf_config=str(path / "config.json"),
            vocab_size=config.vocab_size,
            max_seq_len=config.max_seq_len,
        )
    ).double()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)  # their key map
    adapter.model.load_state_dict(theirs.state_dict(), strict=True)
    return config, native, adapter


def _directions(path, case: str, config, adapter) -> tuple[torch.Tensor, torch.Tensor]:
    """Three random directions as (3, D) in the adapter's parameter order and in the native one: each
    saved as a checkpoint of the case's configuration and read back by each side's own loader."""
    rows = []
    for row in range(3):
        torch.manual_seed(10 + row)
        model = transformers.AutoModelForCausalLM.from_config(CASES[case][0]).double()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p))
        model.save_pretrained(path / f"direction-{row}", safe_serialization=True)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(path / f"direction-{row}", dtype=torch.float64)
        rows.append(({f"model.{k}": v for k, v in theirs.state_dict().items()}, read_hf(path / f"direction-{row}")[1]))
    ours, native = FlatParameters(adapter), FlatParameters(build_model(config))
    return (
        torch.stack([ours.flatten_state(a) for a, _ in rows]),
        torch.stack([native.flatten_state(n) for _, n in rows]),
    )


@pytest.mark.parametrize("case", ["pythia", "llama3-gqa-biases"])
def test_the_adapter_in_float64_equals_the_native_model(tmp_path, case):
    config, native, adapter = _pair(tmp_path / "model", case)
    x = hf_tokens()
    with torch.no_grad():
        theirs, ours = adapter(x), native(x)
    assert float((theirs - ours).abs().max() / ours.abs().max()) < 1e-12
    assert adapter.lowered == set() and adapter.lower_precision(x) == []
    tokens = torch.cat([x, x[:, :1]], dim=1)  # (3, 13): 12 targets a row
    assert gradient_rounding(adapter, tokens, CPU64) < 1e-9  # float64 throughout: only the O(‖δ‖²) term

    V_adapter, V_native = _directions(tmp_path, case, config, adapter)
    exact = EpochHessian(native, tokens, batch_size=3, engine="adjoint", precision=CPU64, directions_per_pass=3)
    exact = exact.quadratic_forms(V_native)
    native_fd = EpochHessian(native, tokens, batch_size=3, engine="finite_difference", precision=CPU64)
    truncation = float((native_fd.quadratic_forms(V_native) - exact).abs().max())
    assert truncation < 1e-6 * float(exact.abs().max())
    for engine in ADAPTER_ENGINES:
        forms = EpochHessian(adapter, tokens, batch_size=3, engine=engine, precision=CPU64).quadratic_forms(V_adapter)
        error = float((forms - exact).abs().max())
        if engine == "finite_difference":  # its own float64 truncation, as on the native model
            assert error <= 2 * truncation + 1e-12 * float(exact.abs().max()), (engine, error, truncation)
        else:
            assert error <= 1e-10 * float(exact.abs().max()), (engine, error)


def test_an_operation_kept_below_float64_is_recorded_and_refuses_finite_differences(tmp_path, monkeypatch):
    """A family whose code defeats the mode (here, RMSNorm through float16, which the mode does not
    lift) is measured, not hidden: the forward records it and finite differences are refused."""
    _, _, adapter = _pair(tmp_path, "llama3-gqa-biases")
    module = transformers.models.llama.modeling_llama

    def rounded(self, h):
        return self.weight * (h.to(torch.float16).to(h.dtype) * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    monkeypatch.setattr(module.LlamaRMSNorm, "forward", rounded)
    tokens = torch.cat([hf_tokens(), hf_tokens()[:, :1]], dim=1)
    assert adapter.lower_precision(hf_tokens()) == ["to"]
    before = [p.detach().clone() for p in adapter.parameters()]
    floor = gradient_rounding(adapter, tokens, CPU64)
    assert all(torch.equal(a, b) for a, b in zip(before, adapter.parameters(), strict=True))  # restored
    assert 1e-6 < floor < 1e-2, floor  # float16 rounding of the norm's input: its ulp, 1e-3, shows
    with pytest.raises(ValueError, match=r"finite differences in float64: this model computes to below float64"):
        EpochHessian(adapter, tokens, batch_size=3, engine="finite_difference", precision=CPU64)
    EpochHessian(adapter, tokens, batch_size=3, engine="double_backward", precision=CPU64)  # exact engines run
