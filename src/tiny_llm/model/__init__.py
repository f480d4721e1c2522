"""The model: the shared causal-LM base with its loss and loss rule (causal), one micro-batch's
loss and gradient that training and analysis share, with the analysis's precision (micro_batch), the layers and jet
rules architectures share (layers), the Llama (llama), GPT-2 (gpt2) and GPT-NeoX (gpt_neox) with
each layer's second-order jet rule beside it (jets holds the jet arithmetic), Hugging Face formats
and imports (hf, hf_runs, adapter), and checkpoint files (safetensors weights, training state
loaded as data, strict key and shape checks, state hashes). The registry of architectures, with
``build_model``, is ``tiny_llm.architectures`` (torch-free, beside the configuration).

Names are imported on first use, so that importing one module does not import them all.
"""

from tiny_llm.lazy import ALL, exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.model.causal": ["IGNORE_INDEX", "check_jet_rules", "count_parameters", "token_losses"],
        "tiny_llm.model.checkpoint": ALL,
        "tiny_llm.model.jets": ["Jet", "JetPass", "add_terms", "per_direction", "per_direction_dot", "shared_matmul"],
        "tiny_llm.model.llama": ["Llama"],
    },
)
