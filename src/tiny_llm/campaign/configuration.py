"""The workflow's configuration, declared once: each section and entry of config/config.yaml a frozen
dataclass whose fields (types, ranges, defaults, docstrings) the workflow schema
(workflow/schemas/config.schema.yaml) is generated from, whole (``python -m
tiny_llm.campaign.settings_reference --write``; a test fails when the committed schema differs).
The analysis settings, spectra, cluster and critical-batch-size entries are the dataclasses their
readers build (``AnalysisSettings``, ``SpectrumSettings``, ``ClusterSettings``, ``CbsExperiment``);
the other entries are read as the schema validated them, with its defaults filled in.

A key a configuration may leave out but never gives as null is ``optional_key()`` (no default is
written); JSON-schema keywords a type does not say (``minItems``, ``uniqueItems``) are given with
the field (``keywords``) or with the type (``Annotated[tuple[X, ...], Items(1)]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from tiny_llm.campaign.cbs import CbsExperiment
from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.declared import (
    Bounds,
    Items,
    NonNegative,
    Pattern,
    Positive,
    PositiveNumber,
    keywords,
    object_schema,
    optional_key,
)
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

__all__ = ["SPELLED", "WorkflowConfiguration", "schema"]

SPELLED = {"noise_samples": "all"}
"""The analysis settings' words for None (``noise_samples: all``)."""


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """A run to train here."""

    config: str
    """Run configuration YAML (sections model, data, training); its data.cache must be a folder
    directly in cache/ (any name), which the workflow prepares (one prepared with other settings by
    another configuration is refused at start-up: name another)."""
    set: dict[str, Any] = field(default_factory=dict)
    """Overrides, section.key -> value."""
    cache_source: Literal["demo", "text", "tokens"] = "demo"
    """Where the token cache comes from."""
    cache_inputs: tuple[str, ...] = ()
    """Input files for cache_source text or tokens."""
    shard_tokens: Positive = 1048576
    """Approximate tokens per cache shard."""
    cache_order: Literal["shuffle", "keep"] = "shuffle"
    """shuffle (default): preparation permutes the sequences of all input files with data.seed, so every batch
    spans the corpus; keep: source order (consecutive sequences of one passage share a batch)."""
    cache_tokenizer: str | None = optional_key()
    """cache_source text: a local Hugging Face tokenizer directory (its tokenizer.json) that encodes the text
    instead of bytes; model.vocab_size must cover its vocabulary (the start-up corpus-size check then leaves the
    count to preparation)."""


@dataclass(frozen=True, kw_only=True)
class Selection:
    """A selection of a suite's revisions whose names carry a step."""

    __schema__ = {"minProperties": 1}

    min_step: NonNegative | None = optional_key()
    max_step: NonNegative | None = optional_key()
    every: Positive | None = optional_key()
    log_spaced: Positive | None = optional_key()


@dataclass(frozen=True, kw_only=True)
class Suite:
    """A checkpoint suite as downloaded: a Hugging Face repository's revisions in the local cache
    (HF_HUB_CACHE, or HF_HOME/hub), never downloaded; each revision's name gives its step (stepN)
    unless stated (a name's rounded tokens, ...-tokens4B, only check tokens_per_step)."""

    __schema_ref__ = "suite"

    repo: str
    """The repository, ORG/NAME (EleutherAI/pythia-160m, say)."""
    revisions: Literal["all"] | Annotated[tuple[str, ...], Items(1)] | Selection | None = optional_key()
    """Which cached revisions, in training order: all (default), a list of names, or a selection of those whose
    name carries a step: min_step and max_step (inclusive), every (every k-th of them), log_spaced (n whose
    steps lie nearest to log-spaced steps; step 0 kept)."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """One Hugging Face checkpoint: a directory, or a cached revision of a repository."""

    __schema__ = {"oneOf": [{"required": ["path"]}, {"required": ["repo", "revision"]}]}

    path: str | None = optional_key()
    """A local Hugging Face model directory (config.json and safetensors or pytorch_model.bin)."""
    repo: str | None = optional_key()
    """A Hugging Face repository (ORG/NAME) whose revision is in the local cache (HF_HUB_CACHE, or HF_HOME/hub);
    never downloaded."""
    revision: str | None = optional_key()
    """With repo: its revision (step1000, say); its name gives the step (stepN) unless stated (its rounded
    tokens, ...-tokens4B, only check tokens_per_step)."""
    step: NonNegative | None = optional_key()
    """Its training step (recorded; the figures' x-axis). Default: its trainer_state.json global_step,
    else its revision's name."""
    tokens: NonNegative | None = optional_key()
    """Its training tokens (recorded; the figures' x-axis). Default: its trainer_state.json
    num_input_tokens_seen, else step x tokens_per_step, else unknown (a warning; the figures then use
    steps); a revision's name that rounds its tokens (...-tokens4B) is refused without tokens_per_step."""


Checkpoints = Annotated[tuple[Checkpoint, ...], Items(1)] | Suite
"""Checkpoints of one model, oldest first: a list, or a suite."""


@dataclass(frozen=True, kw_only=True)
class SeedExperiment(TrainRun):
    """A cross-seed experiment: its runs' configuration and cache as a run's, and its seeds."""

    config: str
    """Run configuration of every seed (sections model, data, training); its data.cache must be a folder
    directly in cache/ (any name), which the workflow prepares: runs of one cache share it, and one
    prepared with other settings by another configuration is refused at start-up (name another)."""
    set: dict[str, Any] = field(default_factory=dict)
    """Overrides of that configuration for every run, section.key -> value."""
    seeds: tuple[NonNegative, ...] | None = optional_key(minItems=2, uniqueItems=True)
    """Initialisation seeds (training.seed), one run each; the data order is shared."""
    hf_checkpoints: dict[str, Checkpoints] | None = optional_key(minProperties=2)
    """Instead of seeds, for models trained elsewhere (PolyPythia, say): seed -> that seed's Hugging Face
    checkpoints, oldest first (a list, or a suite {repo, revisions}). Each seed is imported into
    runs/<name>-seed-<seed> and every checkpoint measured on the one reference set; seeds are compared at equal
    steps. The seeds must carry one tokenizer; config's data.cache is prepared from cache_inputs with it.
    Controls (trained here) do not apply."""
    tokens_per_step: Positive | None = optional_key()
    """With hf_checkpoints, training tokens per optimizer step, for checkpoints whose tokens are not stated."""
    allow_identical_states: bool = False
    """With hf_checkpoints: measure a suite whose checkpoints of different steps hold identical weights (refused
    otherwise, naming them: a suite that serves one checkpoint under several steps' names); identical states are
    measured once and reported."""
    controls: tuple[Literal["same-seed", "data-order"], ...] = ("same-seed", "data-order")
    """same-seed = the first seed trained twice; data-order = the first seed with another data.seed. Trained
    here, so they do not apply to hf_checkpoints."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Measurement settings (tiny_llm.geometry.settings.GeometrySettings)."""
    walltime_minutes: Positive = 60
    """Slurm walltime of each checkpoint's measurement job (minutes)."""


@dataclass(frozen=True, kw_only=True)
class SeedStudy:
    """A study across seeds."""

    analyses: tuple[str, ...] = field(metadata=keywords(minItems=2, uniqueItems=True))
    """The analyses of the study, one per seed."""


@dataclass(frozen=True, kw_only=True)
class SeedComparison:
    """A figure comparing experiments."""

    experiments: tuple[str, ...] = field(metadata=keywords(minItems=1))
    """Names of seed_experiments to compare."""
    labels: tuple[str, ...] | None = optional_key()
    """A label per experiment (default the experiment names)."""
    metrics: tuple[str, ...] | None = optional_key()
    """Metrics to draw (default every metric present)."""


@dataclass(frozen=True, kw_only=True)
class TrainingOrderFiles:
    """A suite's published training order, read in place."""

    path: str | Annotated[tuple[str, ...], Items(1)]
    format: Literal["megatron", "token_array"] | None = optional_key()
    sequences_per_step: Positive
    sequence_tokens: Annotated[int, Bounds(2)] | None = optional_key()
    order: str | None = optional_key()
    dtype: str | None = optional_key()
    order_dtype: str | None = optional_key()


@dataclass(frozen=True)
class SpectrumSection(SpectrumSettings):
    """An analysis's ``spectrum``: the spectral settings and the switch that asks for them."""

    enabled: bool = False
    """Measure Hessian spectra per (state, case)."""


Case = Literal["seen", "unseen", "offset", "recent", "step"]
"""A data case of an analysis."""


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """An analysis."""

    __schema__ = {"anyOf": [{"required": ["run"]}, {"required": ["hf_checkpoints"]}]}

    run: str | None = optional_key()
    """Run directory holding resolved.yaml and the checkpoints (with hf_checkpoints, where they are imported;
    default runs/<name>)."""
    hf_checkpoints: Checkpoints | None = optional_key()
    """Hugging Face checkpoints of one model, oldest first (steps increasing, each directory once), imported
    into the run directory and measured on the offset case: a list of directories or cached revisions, or a
    whole suite ({repo: ORG/NAME, revisions: all | [names] | {min_step, max_step, every, log_spaced}}). A step
    not given is read from the directory's trainer_state.json (a Trainer's checkpoint) or its revision's name.
    The tokenizer they carry (tokenizer.json) is recorded and the cache must have been encoded with it."""
    cache_inputs: tuple[str, ...] | None = optional_key(minItems=1)
    """With hf_checkpoints, text files the workflow prepares the analysis's cache from (data.cache of its
    config, cache/<name>), encoded with the checkpoints' own tokenizer (the first directory's tokenizer.json;
    bytes when it has none) unless cache_tokenizer names another. Without it the cache must be prepared first
    (tiny-llm prepare-data)."""
    cache_source: Literal["text", "tokens"] | None = optional_key()
    """With hf_checkpoints and cache_inputs, what the inputs are (text files or token arrays)."""
    cache_tokenizer: str | None = optional_key()
    """With hf_checkpoints and cache_inputs, a local tokenizer directory to encode the text with instead of the
    checkpoints' own."""
    cache_order: Literal["shuffle", "keep"] | None = optional_key()
    """With hf_checkpoints and cache_inputs, as in train_runs."""
    shard_tokens: Positive | None = optional_key()
    """With hf_checkpoints and cache_inputs, approximate tokens per cache shard."""
    tokens_per_step: Positive | None = optional_key()
    """With hf_checkpoints, training tokens per optimizer step (batch size x sequence length x gradient
    accumulation x devices): the tokens of a checkpoint that states none are step x this. With a
    training_order and without this key: its sequences_per_step x (sequence_tokens - 1), said in the log."""
    allow_identical_states: bool = False
    """With hf_checkpoints: measure a suite whose checkpoints of different steps hold identical weights (refused
    otherwise, naming them: a suite that serves one checkpoint under several steps' names); identical states are
    measured once and reported."""
    adapter: bool = False
    """With hf_checkpoints, keep transformers' own model even for an architecture read natively (Llama family,
    GPT-2, GPT-NeoX): measured through the adapter with the HVP engines (engine double_backward, pearlmutter or
    finite_difference), to compare the two."""
    config: str | None = optional_key()
    """With hf_checkpoints, a run configuration whose data section names the prepared cache and whose training
    section sets the batch (batch_size, micro_batch_size) and the epoch (tokens / epochs)."""
    set: dict[str, Any] = field(default_factory=dict)
    """With hf_checkpoints, overrides of that run configuration (key -> value)."""
    checkpoints: Literal["all"] | Annotated[tuple[str, ...], Items(1)] = "all"
    """all, or a list of root checkpoint files (relative to the run or absolute)."""
    cases: tuple[Literal["seen", "unseen", "offset", "recent", "step"], ...] | None = optional_key(
        minItems=1, uniqueItems=True
    )
    """Data cases to measure (default: seen and unseen; offset for a run imported with tiny-llm import-hf). With
    a training_order: seen, unseen and recent are windows of case_steps training steps: those up to the earliest
    analysed checkpoint, those right after the latest, and those up to each checkpoint's own step. step: the
    batches the step from each checkpoint to the next analysed one trained on (its first case_steps steps with a
    training_order, one epoch for a run trained here; the last checkpoint: the steps after it), on which the
    trajectory statistics measure the step on its own data."""
    training_order: TrainingOrderFiles | None = optional_key()
    """With hf_checkpoints: the suite's published training order, read in place (never copied): {path: PREFIX,
    format: megatron, sequences_per_step: N} (PREFIX.idx + PREFIX.bin, or Pythia's PREFIX-000NN-of-000MM.bin
    shards), or {path: FILE_OR_DIR, format: token_array, sequence_tokens: T, sequences_per_step: N, order:
    INDEX_FILE} (OLMo's flat token arrays, the global index order optional). Sequence i was trained at step i //
    sequences_per_step + 1."""
    case_steps: Positive = 1
    """With a training_order: the training steps of each case's window (its epoch)."""
    batch_sequences: Positive | None = optional_key()
    """With a training_order: the sequences of one noise batch (a divisor of sequences_per_step; default: the
    largest that cuts the window into at least 8 batches; a window of one batch is refused)."""
    settings: AnalysisSettings | None = field(default=None, metadata=keywords(default={}, spelled=SPELLED))
    """Numerical settings of tiny-llm analyze-state."""
    gpus_per_job: Positive = 1
    """Ranks of each (state, case) job, one per GPU (CPU processes locally), launched with torchrun; the passes
    are split over them (data-parallel), or the model is sharded with spectrum.sharded."""
    nodes_per_job: Positive = 1
    """Nodes of each (state, case) job on the cluster, gpus_per_job ranks on each (srun starts torchrun on every
    node)."""
    audit_threshold: PositiveNumber = 0.01
    """Collection warns when a precision-audit relative error exceeds this."""
    spectrum: SpectrumSection | None = field(default=None, metadata=keywords(default={}))
    """Hessian spectra per (state, case); see tiny_llm.workers.settings.SpectrumSettings."""


@dataclass(frozen=True, kw_only=True)
class Plots:
    """The figures."""

    training_norms: bool = False
    """Add the logged pre-clipping training norms to the norms figure (runs trained here; an imported run has no
    training log and is drawn without them, with a note)."""
    x_axis: Literal["auto", "tokens", "step"] = "auto"
    """The figures' x-axis: training tokens or optimizer steps. auto: tokens when every checkpoint's are known,
    else steps."""


@dataclass(frozen=True, kw_only=True)
class WorkflowConfiguration:
    """Configuration of the tiny-llm curvature workflow (config/config.yaml documents each key)."""

    train_runs: dict[str, TrainRun] = field(default_factory=dict)
    """Runs to train, keyed by run name (trained into runs/<name>/)."""
    seed_experiments: dict[str, SeedExperiment] = field(default_factory=dict)
    """Cross-seed experiments, keyed by name (results/<name>/). Runs that differ only in the
    initialisation seed (plus controls), measured on fixed reference batches at every checkpoint."""
    cbs_experiments: dict[str, CbsExperiment] = field(default_factory=dict)
    """Critical-batch-size experiments, keyed by name (results/<name>/). A base run trained here,
    branched from chosen checkpoints with each batch size of a grid for one token budget, over
    data-order seeds; the measured critical batch size beside B_simple and B_noise of the same
    checkpoints. Each entry's keys are declared (and checked by name) in
    tiny_llm.campaign.cbs.CbsExperiment and documented in docs/critical-batch.md."""
    seed_studies: dict[str, SeedStudy] = field(default_factory=dict)
    """Studies across seeds, keyed by name (results/<name>/): several analyses of one model trained
    from different seeds (one per seed, e.g. PolyPythia's repositories) drawn side by side: seeds.csv
    (mean, standard deviation and range over the seeds of each statistic at every step and case) and
    figures/seeds; checkpoints whose weights another seed's has too are named in the log and on the
    figure."""
    seed_comparisons: dict[str, SeedComparison] = field(default_factory=dict)
    """Figures comparing experiments, keyed by name (results/comparisons/<name>/)."""
    analyses: dict[str, Analysis] = field(default_factory=dict)
    """Analyses, keyed by name (results/<name>/)."""
    train_device: Annotated[str, Pattern("^(cpu|cuda(:[0-9]+)?)$", "cpu, cuda or cuda:N")] = "cpu"
    """Device for training the runs of train_runs."""
    settings_override: dict[str, Any] = field(default_factory=dict)
    """Settings imposed on every analysis (a cluster profile sets CUDA / float32 / TF32 here)."""
    cluster: ClusterSettings | None = field(default=None, metadata=keywords(default={}))
    """Walltime of cluster jobs, and what happens to submitted jobs on Ctrl-C and restart."""
    plots: Plots | None = field(default=None, metadata=keywords(default={}))
    """The figures' options."""


def schema() -> dict[str, Any]:
    """The workflow schema, whole: the configuration's object and the definitions it refers to."""
    defs: dict[str, Any] = {}
    body = object_schema(WorkflowConfiguration, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": "Configuration of the tiny-llm curvature workflow (config/config.yaml documents each key).",
        **body,
        "$defs": defs,
    }
