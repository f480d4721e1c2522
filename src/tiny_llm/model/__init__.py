"""The model: the shared causal-LM base with its loss and loss rule (causal), the layers and jet
rules architectures share (layers), the Llama (llama) and GPT-2 (gpt2) with each layer's
second-order jet rule beside it (jets holds the jet arithmetic), ``build_model`` (architectures),
Hugging Face formats and imports (hf, hf_runs, adapter), and checkpoint files (safetensors
weights, training state loaded as data, strict key and shape checks, state hashes).
"""

from tiny_llm.model.causal import IGNORE_INDEX, check_jet_rules, count_parameters, token_losses
from tiny_llm.model.checkpoint import (
    check_state_dict,
    load_model_weights,
    load_train_state,
    load_weights,
    save_train_state,
    save_weights,
    state_hash,
)
from tiny_llm.model.jets import Jet, JetPass, add_terms, per_direction, per_direction_dot, shared_matmul
from tiny_llm.model.llama import Llama

__all__ = [
    "IGNORE_INDEX",
    "Jet",
    "JetPass",
    "Llama",
    "add_terms",
    "check_jet_rules",
    "check_state_dict",
    "count_parameters",
    "load_model_weights",
    "load_train_state",
    "load_weights",
    "per_direction",
    "per_direction_dot",
    "save_train_state",
    "save_weights",
    "shared_matmul",
    "state_hash",
    "token_losses",
]
