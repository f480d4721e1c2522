"""Frozen run configuration (model shape, token stream, training) read from and written to YAML."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml

from tiny_llm.architectures import ARCHITECTURES, Architecture, architecture
from tiny_llm.declared import (
    Bounds,
    NonNegative,
    NonNegativeNumber,
    Positive,
    PositiveNumber,
    build,
    check_fields,
    fail,
)
from tiny_llm.io import parse_yaml

__all__ = [
    "DataConfig",
    "ModelConfig",
    "PackedConfig",
    "RopeScaling",
    "RunConfig",
    "TrainingConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "load_config",
    "load_config_dict",
    "resolved_dict",
    "parse_yaml",
]


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """How the rotary frequencies are stretched for contexts beyond the original training length
    (a ``rope_scaling`` of Hugging Face's Llama family): ``linear`` divides every frequency by
    ``factor``; ``llama3`` (Llama 3.1/3.2) divides the low frequencies by ``factor``, keeps the high
    ones and interpolates between them. Both only change the constant rotation tables."""

    SECTION: ClassVar[str] = "model.rope_scaling"

    kind: Literal["linear", "llama3"]
    """``linear`` or ``llama3``."""
    factor: PositiveNumber
    """Frequencies divided by this (llama3: the low-frequency band only)."""
    low_freq_factor: PositiveNumber = 1.0
    """llama3: wavelengths longer than original_max_seq_len / low_freq_factor are divided by factor."""
    high_freq_factor: PositiveNumber = 4.0
    """llama3: wavelengths shorter than original_max_seq_len / high_freq_factor are kept."""
    original_max_seq_len: Positive | None = None
    """llama3: the context length the model was first trained at (required for llama3)."""

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION + ".")  # types, literals and ranges; cross-field below
        if self.kind == "linear":  # llama3's options would be ignored: refused, not dropped
            for name, default in (("low_freq_factor", 1.0), ("high_freq_factor", 4.0), ("original_max_seq_len", None)):
                if getattr(self, name) != default:
                    fail(f"{self.SECTION}.{name}", "no value under kind linear (a llama3 option)", getattr(self, name))
        if self.kind == "llama3":
            if self.original_max_seq_len is None or self.original_max_seq_len <= 0:
                fail(f"{self.SECTION}.original_max_seq_len", "a positive integer for kind llama3", None)
            if self.high_freq_factor <= self.low_freq_factor:
                fail(
                    f"{self.SECTION}.high_freq_factor",
                    f"a number above low_freq_factor={self.low_freq_factor}",
                    self.high_freq_factor,
                )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture and shape of the decoder: the Llama family (RMSNorm, RoPE, causal attention with
    grouped-query heads, SwiGLU), GPT-2 (LayerNorm, learned positions, causal attention, GELU, biased
    projections) or GPT-NeoX (Pythia: parallel residual, partial rotary, exact GELU)."""

    SECTION: ClassVar[str] = "model"

    architecture: str = "llama"
    """``llama`` (also what Mistral- and Qwen2-style checkpoints import as); ``gpt2`` (as Hugging
    Face's GPT2LMHeadModel: learned positions up to max_seq_len, LayerNorm with bias,
    tanh-approximated GELU, biased projections; rope_theta unused); ``gpt_neox`` (as Hugging Face's
    GPTNeoXForCausalLM, the Pythia suites: LayerNorm with bias, one fused q/k/v projection in
    GPT-NeoX's head-interleaved layout, RoPE on the first rotary_pct of each head, exact GELU,
    parallel_residual); ``hf``: any other Hugging Face causal LM, built by ``transformers`` from the
    config.json at ``hf_config`` (what ``tiny-llm import-hf`` sets up; analysed with the HVP engines
    only; the shape keys then describe it for the memory model)."""
    hf_config: str | None = None
    """architecture hf: the model's Hugging Face config.json (relative to the project, like data.cache)."""
    vocab_size: Positive = 256
    """Number of token ids; 256 for the byte-level tokenizer."""
    d_model: Positive = 32
    """Residual stream width C."""
    n_layers: Positive = 2
    """Number of transformer blocks."""
    n_heads: Positive = 4
    """Attention (query) heads; must divide d_model (RoPE needs an even head_dim = d_model / n_heads)."""
    n_kv_heads: Positive | None = None
    """llama: key/value heads (grouped-query attention: each serves n_heads / n_kv_heads query
    heads); null = n_heads (multi-head attention)."""
    d_ff: Positive = 64
    """Hidden width of the feed-forward block (SwiGLU for llama, GELU MLP for gpt2 and gpt_neox)."""
    max_seq_len: Positive = 64
    """Longest sequence the model accepts (RoPE tables are built up to this length; gpt2: the
    number of learned positions)."""
    rope_theta: PositiveNumber = 10000.0
    """RoPE base frequency (llama, gpt_neox)."""
    rope_scaling: RopeScaling | None = None
    """llama, gpt_neox: RoPE frequency scaling (``{kind: linear, factor: 4}`` or Llama 3.x's ``{kind: llama3,
    factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_seq_len: 8192}``); null = none."""
    rotary_pct: Annotated[float, Bounds(0, 1, open_low=True)] = 1.0
    """Fraction of each head's features that RoPE rotates (gpt_neox: Pythia uses 0.25; the rest
    pass unrotated); rotary_pct × head_dim must be a positive even integer."""
    attention_bias: Literal["none", "qkv", "all"] | None = None
    """llama, gpt_neox: biases of the attention projections: ``qkv`` (Qwen2: q, k and v only),
    ``all`` (the output projection too) or ``none``; null = the architecture's own (llama none,
    gpt2 and gpt_neox all)."""
    mlp_bias: bool | None = None
    """llama, gpt_neox: biases of the feed-forward projections; null = the architecture's own
    (llama false, gpt2 and gpt_neox true)."""
    parallel_residual: bool = True
    """gpt_neox: x + attention(norm₁ x) + mlp(norm₂ x) (Pythia) rather than one after the other."""
    norm_eps: PositiveNumber = 1e-5
    """Epsilon of the normalisation layers (RMSNorm for llama, LayerNorm for gpt2 and gpt_neox)."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection (counted once in D)."""

    def __post_init__(self) -> None:
        architecture(self.architecture)  # an unknown one is refused first, listing the known ones
        check_fields(self, self.SECTION + ".")  # types, literals and ranges; cross-field below
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            fail("model.n_heads", f"a divisor of model.d_model={self.d_model} ({divisors})", self.n_heads)
        if (self.architecture == "hf") != (self.hf_config is not None):
            fail("model.hf_config", "a config.json path exactly when model.architecture is hf", self.hf_config)
        if self.spec.rotary and (self.rotary_dim % 2 or self.rotary_dim == 0):
            if self.rotary_pct == 1.0:
                fail("model.n_heads", f"a value giving an even head_dim (d_model={self.d_model})", self.n_heads)
            fail("model.rotary_pct", f"a fraction giving an even, positive share of {self.head_dim}", self.rotary_pct)
        self._check_variants()

    def _check_variants(self) -> None:
        """Each architecture's own options (as its registry entry declares them): another
        architecture's option is refused unless at its default (it would be ignored)."""
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            divisors = [h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]
            fail("model.n_kv_heads", f"null or a divisor of n_heads={self.n_heads} ({divisors})", self.n_kv_heads)
        own = self.spec.fields
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            neutral = value == option.default or (option.name == "n_kv_heads" and value == self.n_heads)
            if option.name not in own and not neutral:
                having = [a.name for a in ARCHITECTURES.values() if option.name in a.fields]
                fail(
                    f"model.{option.name}",
                    f"its default unless model.architecture is {' or '.join(having)}",
                    value,
                )
        for option, values, why in self.spec.allowed:  # what its layers can build, as it declares
            if getattr(self, option) not in values:
                spelled = ["null" if v is None else str(v).lower() for v in values]
                words = f"{', '.join(spelled[:-1])} or {spelled[-1]}"
                fail(f"model.{option}", f"{words} for {self.architecture} ({why})", getattr(self, option))

    @property
    def spec(self) -> Architecture:
        """Its architecture's registry entry (:mod:`tiny_llm.architectures`)."""
        return architecture(self.architecture)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads without grouped-query attention."""
        return self.n_kv_heads or self.n_heads

    @property
    def rotary_dim(self) -> int:
        """Features of each head that RoPE rotates (the first ones)."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def attention_biases(self) -> Literal["none", "qkv", "all"]:
        """attention_bias resolved: the architecture's own when not given."""
        if self.attention_bias is not None:
            return self.attention_bias
        return "all" if self.spec.biased else "none"

    @property
    def mlp_biased(self) -> bool:
        """mlp_bias resolved: the architecture's own when not given."""
        return self.spec.biased if self.mlp_bias is None else self.mlp_bias


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the token cache lives and how the training stream is cut from it."""

    SECTION: ClassVar[str] = "data"

    cache: str = "cache/demo"
    """Token cache directory (meta.json + shards), relative to the working directory."""
    seq_len: Positive = 64
    """Sequence length T; a block is seq_len + 1 tokens (inputs and the targets shifted by one)."""
    shuffle_group_blocks: Positive = 64
    """Blocks per shuffle group; block order is permuted inside each group with the data seed."""
    seed: NonNegative = 1234
    """Data seed for the shuffle-group permutations (the unseen stream derives its own)."""
    stream_offset: NonNegative = 0
    """Sequences of the training stream passed over before the first batch: 0, or, for a branch
    (``training.init_from``), the sequences its parent had trained on when it saved that state, so
    that the branch reads what its parent would have read next (the same data seed)."""
    prepare_train_tokens: Positive | None = None
    """Minimum training capacity in tokens when preparing a cache; null = what training plus
    one unseen analysis epoch need."""

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION + ".")  # types, literals and ranges


@dataclass(frozen=True, kw_only=True)
class PackedConfig:
    """Local SGD: K workers take interleaved batches of one stream and are averaged periodically."""

    SECTION: ClassVar[str] = "training.packed"

    workers: Annotated[int, Bounds(2)] = 2
    """Number of local workers K (at least 2)."""
    sync_every: Positive = 1
    """Average all workers after every this many local steps."""

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION + ".")  # types, literals and ranges


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """Optimisation settings; everything here except log_every is scientific (fixed on resume)."""

    SECTION: ClassVar[str] = "training"

    batch_size: Positive = 16
    """Sequences per optimizer step (per worker for packed runs)."""
    micro_batch_size: Positive = 16
    """Sequences per forward/backward; the last micro-batch of a step holds the remainder."""
    tokens: Positive = 65536
    """Nominal training budget in target tokens (all workers together); rounded down to whole steps."""
    epochs: Positive = 4
    """Number of virtual epochs the budget is divided into (checkpoint interval)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """Optimizer."""
    lr: PositiveNumber = 3e-3
    """Peak learning rate."""
    min_lr_ratio: Annotated[float, Bounds(0, 1)] = 0.1
    """Final learning rate as a fraction of lr (cosine schedule)."""
    warmup_steps: NonNegative = 10
    """Linear warmup steps."""
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after warmup."""
    weight_decay: NonNegativeNumber = 0.1
    """Decoupled weight decay, applied to matrices and embeddings only (not norm weights)."""
    beta1: Annotated[float, Bounds(0, 1, open_high=True)] = 0.9
    """AdamW first-moment decay."""
    beta2: Annotated[float, Bounds(0, 1, open_high=True)] = 0.95
    """AdamW second-moment decay."""
    adam_eps: PositiveNumber = 1e-8
    """AdamW epsilon."""
    momentum: NonNegativeNumber = 0.9
    """SGD momentum."""
    grad_clip: NonNegativeNumber = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    seed: NonNegative = 0
    """Initialisation seed."""
    attention_backend: Literal["sdpa", "reference"] = "sdpa"
    """Attention implementation used for training (analysis always uses reference)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Precision of the weights, gradients and optimizer state in training. Rounding differs
    across CPUs and training amplifies it: on the demo model float32 runs on two CPU kernel sets
    differ visibly after a few hundred steps, float64 runs only after about a thousand. float64
    costs up to twice float32's time and memory."""
    checkpoint_policy: Literal["final", "interval"] = "final"
    """final: final.pt only; interval: epoch-NNN.safetensors at every virtual epoch (000 = init) too."""
    packed: PackedConfig | None = None
    """Local-SGD settings, or null for an ordinary run."""
    init_from: str | None = None
    """A training state (``state-NNN.pt`` that another run kept by ``keep_states``) whose weights and
    optimizer state this run starts from instead of initialising from ``seed``: a branch of that
    run. null: an ordinary run."""
    keep_states: tuple[NonNegative, ...] = ()
    """Virtual epochs at whose end the whole training state (weights and optimizer state) is kept
    as ``state-NNN.pt``, for branches to start from (not scientific: keeping states changes no number)."""
    keep_moments: bool = True
    """With ``checkpoint_policy: interval`` and AdamW (one worker), keep the optimizer's moments at
    every checkpoint as ``moments-NNN.safetensors`` (twice the float32 weights' size on disk), so
    that the analysis can take its statistics in the optimizer's own geometry (not scientific)."""
    log_every: Positive = 10
    """Progress line every this many steps (not scientific)."""

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION + ".")  # types, literals and ranges; cross-field below
        if self.micro_batch_size > self.batch_size:
            fail("training.micro_batch_size", f"at most training.batch_size={self.batch_size}", self.micro_batch_size)
        if late := [epoch for epoch in self.keep_states if epoch > self.epochs]:  # would be ignored: never reached
            fail("training.keep_states", f"virtual epochs up to training.epochs={self.epochs}", late)

    @property
    def workers(self) -> int:
        return self.packed.workers if self.packed else 1


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A complete run: model, data and training sections, cross-checked."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)

    def __post_init__(self) -> None:
        if self.data.seq_len > self.model.max_seq_len:
            fail("data.seq_len", f"at most model.max_seq_len={self.model.max_seq_len}", self.data.seq_len)
        if self.steps_per_epoch < 1:
            need = self.training.epochs * self.batch_tokens
            fail("training.tokens", f"at least epochs x batch_size x seq_len = {need}", self.training.tokens)
        if self.steps_per_epoch % self.training.workers:
            fail(
                "training.tokens",
                f"a budget giving whole rounds of {self.training.workers} workers per epoch "
                f"(stream batches per epoch = {self.steps_per_epoch})",
                self.training.tokens,
            )

    @property
    def batch_tokens(self) -> int:
        """Target tokens of one optimizer batch."""
        return self.training.batch_size * self.data.seq_len

    @property
    def steps_per_epoch(self) -> int:
        """Stream batches per virtual epoch (for packed runs: all workers' local batches together)."""
        return self.training.tokens // (self.training.epochs * self.batch_tokens)

    @property
    def local_steps_per_epoch(self) -> int:
        """Optimizer steps each worker takes per virtual epoch."""
        return self.steps_per_epoch // self.training.workers

    @property
    def total_batches(self) -> int:
        """Stream batches consumed by the whole run."""
        return self.steps_per_epoch * self.training.epochs


# --- dict <-> dataclass ---------------------------------------------------------------------


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build a validated RunConfig from nested plain data (defaults fill missing keys).

    Raises:
        ValueError: unknown keys, wrong types or impossible values, naming the key and what is allowed.
    """
    if not isinstance(data, dict):
        raise ValueError(f"configuration must be a mapping with sections model, data, training; got {data!r}")
    return build(RunConfig, data, "")


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict of every field (the resolved form)."""
    return dataclasses.asdict(config)


def load_config_dict(path: str | Path) -> dict[str, Any]:
    """Read a YAML configuration file into plain data (empty file -> empty dict)."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"configuration file {path} does not exist") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    return data or {}


def load_config(path: str | Path) -> RunConfig:
    """Read a run's resolved.yaml (or any run configuration) into frozen dataclasses.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
        >>> _ = p.write_text("model: {d_model: 16, n_heads: 2}")
        >>> load_config(p).model.head_dim
        8
    """
    try:
        return config_from_dict(load_config_dict(path))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def resolved_dict(config: RunConfig) -> dict[str, Any]:
    """The resolved form a run records (resolved.yaml): every field, but of ``model`` only the
    options its architecture has (the others are at their defaults, and a file that lists them, as
    older ones do, loads to the same configuration)."""
    data = config_to_dict(config)
    data["training"]["keep_states"] = list(config.training.keep_states)  # YAML has no tuples
    data["model"] = {k: v for k, v in data["model"].items() if k in config.model.spec.fields}
    return data


def dump_config(config: RunConfig) -> str:
    """YAML text of the resolved configuration (:func:`resolved_dict`), in a stable key order."""
    return yaml.safe_dump(resolved_dict(config), sort_keys=False)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``section.key=value`` overrides applied (values parsed as YAML)."""
    result = yaml.safe_load(yaml.safe_dump(data))  # deep copy of plain data
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected section.key=value, e.g. training.lr=0.001")
        parts = key.split(".")
        node = result
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = parse_yaml(text)
    return result
