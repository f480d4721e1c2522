"""The architectures a run can name (``model.architecture``), declared once, and the one constructor
for them: our Llama family, GPT-2 and GPT-NeoX (every engine), and ``hf``, any other Hugging Face
causal LM through the adapter (the engines that need no second-order rules).

Each is an :class:`Architecture` in :data:`ARCHITECTURES`: its model class (``"module:Class"``,
imported when a model is built, so that this registry, and the planner and settings that ask it,
need no torch) and what it can do. Whatever asks whether a model has second-order rules (the
engines' refusal, ``auto``'s choice, the head in token chunks, the memory plan, the precision
audit) asks :func:`jet_rules` here; nothing infers it from a model's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiny_llm.registry import load, named
from tiny_llm.shapes import GPT2, GPT_NEOX, LLAMA, ParameterShapes, ParameterTable

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "ARCHITECTURES",
    "JET_REFUSAL",
    "SHAPE",
    "Architecture",
    "architecture",
    "build_model",
    "jet_rules",
    "parameter_shapes",
]

SHAPE = (
    "architecture",
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "d_ff",
    "max_seq_len",
    "norm_eps",
    "tie_embeddings",
)
"""The options of ``model`` every architecture has (the shape, which the memory model reads too)."""

JET_REFUSAL = (
    "the taylor and adjoint engines need second-order rules, which only this project's own "
    "architectures (llama, gpt2, gpt_neox) have; measure a Hugging Face model of another architecture "
    "(or one imported with --adapter) with engine double_backward, pearlmutter or finite_difference"
)
"""Why a jet engine refuses a model without second-order rules (the adapter's models)."""


@dataclass(frozen=True)
class Architecture:
    """One architecture and what it declares."""

    name: str
    model: str
    """``module:Class`` of its model, built as ``Class(config, attention_backend=...)``."""
    jets: bool
    """Every layer has a second-order (jet) rule, and the model exposes ``hidden`` and
    ``head_weight``: the taylor and adjoint engines, the head and loss in token chunks and the
    sharded exact forms."""
    options: tuple[str, ...] = ()
    """Its own options of ``model`` beyond the shape (``SHAPE``): a configuration gives no other
    (another architecture's option is refused unless at its default), and a run's resolved.yaml
    records only these."""
    biased: bool = False
    """Its projections carry biases when ``attention_bias`` / ``mlp_bias`` are not given."""
    hf_model_types: tuple[str, ...] = ()
    """The Hugging Face ``model_type`` values whose checkpoints import natively as this architecture
    (each a format in ``tiny_llm.model.hf_formats.FORMATS``); any other comes in through the adapter."""
    rotary: bool = False
    """Its positions are rotary (RoPE on ``rotary_pct`` of each head): the rotated share of a head
    must be even and positive."""
    allowed: tuple[tuple[str, tuple[Any, ...], str], ...] = ()
    """(option, the values it can represent, why): a shared option's values its layers cannot build
    (GPT-2's projections are always biased), refused by name."""
    parameters: ParameterTable | None = None
    """Its parameter table (names, shapes from a configuration, checkpoint keys, transposes, blocks),
    without torch; None: read from a model built on the meta device, for the adapter's models, whose
    parameters transformers decides."""

    @property
    def fields(self) -> tuple[str, ...]:
        """Every option of ``model`` it has: the shape and its own."""
        return SHAPE + self.options

    def model_class(self) -> type:
        """Its model class (imported on first use)."""
        return load(self.model)


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            "llama",
            "tiny_llm.model.llama:Llama",
            jets=True,
            options=("n_kv_heads", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias"),
            hf_model_types=("llama", "mistral", "qwen2"),
            rotary=True,
            parameters=LLAMA,
        ),
        Architecture(
            "gpt2",
            "tiny_llm.model.gpt2:GPT2",
            jets=True,
            options=("attention_bias", "mlp_bias"),
            biased=True,
            hf_model_types=("gpt2",),
            allowed=(
                ("attention_bias", (None, "all"), "its projections are biased"),
                ("mlp_bias", (None, True), "its projections are biased"),
            ),
            parameters=GPT2,
        ),
        Architecture(
            "gpt_neox",
            "tiny_llm.model.gpt_neox:GPTNeoX",
            jets=True,
            options=("rope_theta", "rope_scaling", "rotary_pct", "attention_bias", "mlp_bias", "parallel_residual"),
            biased=True,
            hf_model_types=("gpt_neox",),
            rotary=True,
            allowed=(("attention_bias", ("none", "all", None), "q, k and v are one fused projection"),),
            parameters=GPT_NEOX,
        ),
        Architecture("hf", "tiny_llm.model.adapter:HFCausalLM", jets=False, options=("hf_config",)),
    )
}
"""Every architecture by the name ``model.architecture`` gives."""


def architecture(name: str) -> Architecture:
    """The architecture called ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    return named(ARCHITECTURES, name, "model.architecture")


def jet_rules(config: Any) -> bool:
    """Whether the models of ``config`` (a ``ModelConfig``, or a model that carries one as its
    ``config``) have second-order rules, as their architecture declares.

    Example:
        >>> from tiny_llm.config import ModelConfig
        >>> jet_rules(ModelConfig(architecture="gpt2", d_model=8, n_heads=2, d_ff=32))
        True
    """
    if not hasattr(config, "architecture"):  # a model: its configuration
        config = config.config
    return architecture(config.architecture).jets


def build_model(config: Any, attention_backend: str = "reference") -> nn.Module:
    """The model ``config.architecture`` names, freshly initialised.

    Example:
        >>> from tiny_llm.config import ModelConfig
        >>> type(build_model(ModelConfig(architecture="gpt2", d_model=8, n_heads=2, d_ff=32))).__name__
        'GPT2'
    """
    return architecture(config.architecture).model_class()(config, attention_backend=attention_backend)


def parameter_shapes(config: Any) -> ParameterShapes:
    """The parameters of the model ``config`` describes, by name and shape: declared by its
    architecture (no torch), or read from a model built on the meta device (the adapter's)."""
    table = architecture(config.architecture).parameters
    if table is not None:
        return table.shapes(config)
    import torch

    with torch.device("meta"):
        model = build_model(config)
    by_rows = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    root = {name: tuple(p.shape) for name, p in model.named_parameters()}
    rows = tuple(name for name, p in model.named_parameters() if id(p) in by_rows)
    return ParameterShapes(root, {}, 0, rows)
