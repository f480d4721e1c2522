"""tiny-llm curvature: gradient noise and Hessian curvature of small causal language models."""

from tiny_llm.config import RunConfig, load_config

__all__ = ["Llama", "RunConfig", "count_parameters", "load_config", "token_losses"]
__version__ = "0.1.0"

_MODEL = ("Llama", "count_parameters", "token_losses")


def __getattr__(name: str):
    """The model's names, imported on first use: ``import tiny_llm`` (and the command line's
    ``--help``) does not import torch."""
    if name in _MODEL:
        from tiny_llm.model import llama

        return getattr(llama, name)
    raise AttributeError(f"module 'tiny_llm' has no attribute {name!r}")
