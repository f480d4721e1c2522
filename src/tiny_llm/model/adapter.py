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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tiny_llm.config import ModelConfig

__all__ = ["HFCausalLM"]


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

    def train(self, mode: bool = True) -> HFCausalLM:
        """Evaluation mode always: dropout would make the loss random."""
        super().train(mode)
        self.model.eval()
        return self

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.size(1) > self.config.max_seq_len:
            raise ValueError(f"sequence length {idx.size(1)} exceeds model.max_seq_len={self.config.max_seq_len}")
        return self.model(input_ids=idx, use_cache=False).logits

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
