"""tiny-llm curvature: gradient noise and Hessian curvature of small causal language models."""

from tiny_llm.config import RunConfig, load_config
from tiny_llm.model.llama import Llama, count_parameters, token_losses

__all__ = ["Llama", "RunConfig", "count_parameters", "load_config", "token_losses"]
__version__ = "0.1.0"
