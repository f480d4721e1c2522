"""The architectures a run can name (``model.architecture``) and the one constructor for them:
our Llama family, GPT-2 and GPT-NeoX (every engine), and ``hf``, any other Hugging Face causal LM through the
adapter (the HVP engines)."""

from __future__ import annotations

from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import AttentionBackend, CausalLM
from tiny_llm.model.gpt2 import GPT2
from tiny_llm.model.gpt_neox import GPTNeoX
from tiny_llm.model.llama import Llama

__all__ = ["ARCHITECTURES", "build_model"]

ARCHITECTURES: dict[str, type[CausalLM]] = {"llama": Llama, "gpt2": GPT2, "gpt_neox": GPTNeoX}


def build_model(config: ModelConfig, attention_backend: AttentionBackend = "reference") -> nn.Module:
    """The model ``config.architecture`` names, freshly initialised.

    Example:
        >>> type(build_model(ModelConfig(architecture="gpt2", d_model=8, n_heads=2, d_ff=32))).__name__
        'GPT2'
    """
    if config.architecture == "hf":
        from tiny_llm.model.adapter import HFCausalLM

        return HFCausalLM(config)
    return ARCHITECTURES[config.architecture](config, attention_backend=attention_backend)
