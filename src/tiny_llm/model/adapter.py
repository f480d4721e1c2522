"""Any other Hugging Face causal language model, measured as it is (``model.architecture: hf``).

A thin adapter: ``transformers`` builds the model from its config.json (no download: the
configuration is local and the weights come from our checkpoint), ``forward(idx)`` returns its
logits, and the loss is ours (token-mean cross-entropy, ignored targets), so the gradients, the
noise statistics, the spectra and the audit run with the Hessian-vector-product engines
(``double_backward``, ``pearlmutter``, ``finite_difference``). Its layers have no second-order
rules here, so the quadratic-form engines (``taylor``, ``adjoint``) refuse it by name.

Attention runs in ``transformers``' eager implementation (explicit softmax: every derivative
path has its rules), and the model stays in evaluation mode (no dropout) whatever mode it is put
in. The state dict keys are the Hugging Face model's own, with the tensors a tied head shares
saved once (safetensors refuses shared storage).

A float64 model is float64 in every operation. ``transformers`` keeps float32 arithmetic inside a
float64 model (the eager softmax, RMSNorm and the RoPE frequencies and angles are taken in float32:
about 1e-7 of the logits, and finite differences of its gradients 1e-3 off). While a float64 model
runs, ``Float64Arithmetic`` (a torch function mode, so it holds for any family's code, not a list of
patched classes) turns every request for float32 into float64: a ``dtype=torch.float32`` argument,
``.float()``, ``.to``/``.type`` to float32, and factory functions' default dtype; and the derived
buffers a model computed in float32 when it was built (RoPE's ``inv_freq``) are built again under it.
What still comes out in a lower precision (an operation that defeats the mode) is recorded by name
in ``lowered``: a float64 analysis reports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tiny_llm.config import ModelConfig

__all__ = ["Float64Arithmetic", "HFCausalLM"]


class Float64Arithmetic(TorchFunctionMode):
    """Every float32 request of the code run under it becomes float64 (module docstring); the names
    of operations whose floating output is still of a lower precision go to ``lowered``."""

    def __init__(self) -> None:
        super().__init__()
        self.lowered: set[str] = set()
        self._default = torch.get_default_dtype()

    def __enter__(self) -> Float64Arithmetic:
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        if func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype != torch.float64:
            self.lowered.add(getattr(func, "__name__", repr(func)))
        return out


def _float64_buffers(model: nn.Module) -> list[str]:
    """Build again, under ``Float64Arithmetic``, every module's derived floating buffers (those not
    in the state dict: RoPE frequencies and the like, computed from the configuration when the model
    was built); the names of those whose module could not be rebuilt from its ``config``."""
    kept = []
    for name, module in model.named_modules():
        derived = [b for b in module._non_persistent_buffers_set if getattr(module, b) is not None]
        derived = [b for b in derived if getattr(module, b).is_floating_point()]
        if not derived:
            continue
        try:
            with Float64Arithmetic():
                fresh = type(module)(module.config)
        except (AttributeError, TypeError, ValueError):  # not built from a config alone
            kept += [f"{name}.{b}" for b in derived]
            continue
        for b in derived:
            setattr(module, b, getattr(fresh, b).to(getattr(module, b).device))
    return kept


class HFCausalLM(nn.Module):
    """A ``transformers`` ``AutoModelForCausalLM`` behind our model interface.

    Args:
        config: ``architecture: hf`` with ``hf_config`` naming the model's config.json.
        attention_backend: kept for the interface; the adapter always uses eager attention.
    """

    def __init__(self, config: ModelConfig, attention_backend: str = "reference"):
        super().__init__()
        import transformers

        path = Path(config.hf_config)
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(
                f"model.hf_config: cannot read {path} ({error}); import the model again (tiny-llm import-hf)"
            ) from None
        data = {
            k: v for k, v in data.items() if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")
        }
        hf_config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
        hf_config.use_cache = False
        self.config, self.attention_backend = config, "reference"
        self.model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
        self.model.eval()
        self.lowered: set[str] = set()
        """Operations (and derived buffers) still of a lower precision in a float64 forward."""
        self._float64_buffers = False

    def train(self, mode: bool = True) -> HFCausalLM:
        """Evaluation mode always: dropout would make the loss random."""
        super().train(mode)
        self.model.eval()
        return self

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.size(1) > self.config.max_seq_len:
            raise ValueError(f"sequence length {idx.size(1)} exceeds model.max_seq_len={self.config.max_seq_len}")
        if self.model.get_input_embeddings().weight.dtype != torch.float64:
            return self.model(input_ids=idx, use_cache=False).logits
        if not self._float64_buffers:  # once: the buffers built in float32 with the model
            self.lowered |= set(_float64_buffers(self.model))
            self._float64_buffers = True
        with Float64Arithmetic() as arithmetic:
            logits = self.model(input_ids=idx, use_cache=False).logits
        self.lowered |= arithmetic.lowered
        return logits

    def lower_precision(self, inputs: torch.Tensor) -> list[str]:
        """What a float64 forward of ``inputs`` still computes below float64 (one forward, no
        gradient): the operations and derived buffers ``Float64Arithmetic`` could not lift; empty
        when the model is not float64 or nothing remains."""
        with torch.no_grad():
            self(inputs)
        return sorted(self.lowered) if self.model.get_input_embeddings().weight.dtype == torch.float64 else []

    def shared_keys(self) -> dict[str, str]:
        """State dict keys whose tensor is another key's (tied weights) -> that key."""
        first: dict[int, str] = {}
        shared = {}
        for key, tensor in super().state_dict(keep_vars=True).items():
            owner = first.setdefault(id(tensor), key)
            if owner != key:
                shared[key] = owner
        return shared

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        for key in self.shared_keys():
            state.pop(prefix + key, None)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """Tied keys may be absent: they take the tensor of the key they share (then loaded strictly)."""
        full = dict(state)
        for key, owner in self.shared_keys().items():
            if owner in state:
                full.setdefault(key, state[owner])
        return super().load_state_dict(full, strict=strict, assign=assign)
