"""The analysis worker: one parameter state × one data case → one atomic result JSON.

``analyze_state(run_dir, checkpoints, case, settings, output)`` checks everything before any
compute (root checkpoints only, identical aliases, strict names/shapes, finite weights, packed
workers present and consistent with the saved average, cache capacity, precision options), runs
``noise.measure_case`` and writes the result (keys listed in the README) atomically. An existing result
with the same identity is reused; one with another identity is refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from tiny_llm.config import ModelConfig, RunConfig, config_to_dict, load_config
from tiny_llm.curvature.hessian import ENGINES, HVP_ENGINES, FlatParameters, Precision, runtime_settings
from tiny_llm.curvature.memory import MemoryPlan, device_budget, plan_analysis
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.corpus import describe_tokenizer, same_tokenizer
from tiny_llm.data.order import order_report
from tiny_llm.data.tokens import TokenCache, check_capacity, epoch_plan, offset_plan, unseen_plan
from tiny_llm.distributed import barrier, broadcast, is_writer
from tiny_llm.distributed import record as parallel_record
from tiny_llm.io import atomic_write_json, check_writable_file, exclusive, remove_leftovers
from tiny_llm.layout import IMPORTED, RESOLVED, SUMMARY
from tiny_llm.model.adapter import HFCausalLM
from tiny_llm.model.architectures import build_model
from tiny_llm.model.checkpoint import check_state_dict, load_train_state, load_weights, state_hash
from tiny_llm.model.hf_runs import run_tokenizer
from tiny_llm.provenance import canonical_hash, hardware, slurm_job, software, source_hash
from tiny_llm.runtime import compile_record, resolve_device
from tiny_llm.training.loop import average_states

__all__ = [
    "AnalysisSettings",
    "CASES",
    "EXECUTION_SETTINGS",
    "LoadedState",
    "analyze_state",
    "check_output_binding",
    "explain_out_of_memory",
    "holds_results",
    "memory_plan",
    "numerical_settings",
    "settings_record",
    "load_state",
    "output_binding",
    "quadratic_form_engine",
    "resolve_checkpoints",
    "settings_from_dict",
    "single_writer",
]

log = logging.getLogger(__name__)

CASES = ("seen", "unseen", "offset")
"""seen: epoch 1 as trained; unseen: one epoch after training's final shuffle group; offset: one
batch-aligned epoch of the cache from ``data_offset`` batches on (the case of imported runs,
whose training stream is not known)."""
EXECUTION_SETTINGS = ("memory_budget_gb",)
"""Settings that change how the work is cut, not its numbers: not part of identities or bindings."""
RESULT_SCHEMA = 1
ROOT_CHECKPOINT = re.compile(r"^(epoch-\d+\.safetensors|final\.pt)$")
_WORKER_DIR = re.compile(r"^node-\d+$")


@dataclass(frozen=True, kw_only=True)
class AnalysisSettings:
    """Numerical and sampling settings of an analysis (all part of a result's identity)."""

    noise_samples: int | None = 32
    """S_v, sampled effective batches (None = every batch of the epoch; capped by the epoch)."""
    random_samples: int = 32
    """S_r, Rademacher directions."""
    seed: int = 42
    """Seed of the noise-batch draw and the Rademacher directions (reused across checkpoints)."""
    hvp_batch_size: int | None = None
    """Curvature micro-batch size (None = training.micro_batch_size); never changes H."""
    directions_per_pass: int = 16
    """K directions share each pass over the data; bounded by memory."""
    engine: Literal["auto", "taylor", "adjoint", "double_backward", "pearlmutter", "finite_difference"] = "auto"
    """Engine of every quadratic form vᵀHv: taylor or adjoint (second derivatives along v, no Hv),
    or an HVP engine. auto: adjoint for K > 1 directions per pass, taylor for K = 1 (the fastest
    exact engines measured). Spectra need Hv: they use this engine when it is an HVP engine, else
    pearlmutter (compiled) on CUDA and double_backward on CPU."""
    compile_hvp: bool = True
    """torch.compile the Pearlmutter product on CUDA (CPU analysis stays eager)."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameter dtype of the analysis model; float64 for derivative checks."""
    tf32: bool = True
    """TF32 matmuls for float32 on CUDA."""
    amp: bool = False
    """bf16 autocast in the forward only (float32 parameters; scores, norms, cross-entropy fp32)."""
    consensus: bool = True
    """Packed runs: measure each worker's consensus error eᵢ = xᵢ − x̄."""
    audit: bool | Literal["auto"] = "auto"
    """Precision audit, first in the job: ḡ and the loss over the epoch in float64, and a seeded
    subset of the directions rebuilt and measured in float64, giving the error each statistic
    implies (true / false). auto: on unless the analysis runs in float64 without autocast."""
    audit_directions: int = 4
    """Audited noise directions and random directions (each; ḡᵀHḡ is always audited)."""
    audit_batches: int = 4
    """Curvature micro-batches (seeded) over which the audit compares production and float64."""
    data_offset: int = 0
    """Case offset: the epoch starts this many batches (of training.batch_size sequences) into the
    cache, in cache order."""
    memory_budget_gb: float | None = None
    """Memory (GiB) a job may use on its device; every pass is cut into groups of sequences that the
    memory model says fit it (the numbers do not change, so it is not part of a result's identity).
    None: on CUDA the device's free memory less a margin, elsewhere no budget."""

    @property
    def audited(self) -> bool:
        """Whether the precision audit runs."""
        return self.audit is True or (self.audit == "auto" and (self.dtype != "float64" or self.amp))

    def __post_init__(self) -> None:
        for name in ("random_samples", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a non-negative integer, got {getattr(self, name)}")
        for name in ("noise_samples", "hvp_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: expected a positive integer or all/default, got {value}")
        if self.directions_per_pass < 1:
            raise ValueError(f"directions_per_pass: expected a positive integer, got {self.directions_per_pass}")
        if self.engine not in ("auto", *ENGINES):
            raise ValueError(f"engine: expected one of auto, {', '.join(ENGINES)}, got {self.engine!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype!r}")
        if self.audit in ("on", "off"):  # the command line's words, in a configuration too
            object.__setattr__(self, "audit", self.audit == "on")
        if not (self.audit == "auto" or isinstance(self.audit, bool)):
            raise ValueError(f"audit: expected auto, true or false, got {self.audit!r}")
        for name in ("audit_directions", "audit_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.memory_budget_gb is not None and not (
            isinstance(self.memory_budget_gb, (int, float)) and 0 < self.memory_budget_gb < float("inf")
        ):
            raise ValueError(
                f"memory_budget_gb: expected a positive number of GiB or null, got {self.memory_budget_gb!r}"
            )
        if self.amp and self.dtype != "float32":
            raise ValueError("--amp requires --dtype float32 (bf16 autocast with float32 parameters)")


@dataclass
class LoadedState:
    """A verified parameter state: root weights, aliases, and packed workers when measured."""

    root: dict[str, torch.Tensor]
    weights_hash: str
    aliases: list[dict[str, Any]]
    workers: list[dict[str, torch.Tensor]] = field(default_factory=list)
    worker_hashes: list[str] = field(default_factory=list)
    worker_files: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """weights_hash, or for consensus-enabled packed states a hash of it and the ordered worker hashes."""
        if not self.workers:
            return self.weights_hash
        return canonical_hash({"average": self.weights_hash, "workers": self.worker_hashes})


def resolve_checkpoints(run_dir: Path, names: list[str]) -> list[Path]:
    """Checkpoint paths (relative to the run directory, or absolute), root checkpoints only.

    Raises:
        ValueError: worker files, files outside the run directory, unknown or missing files.
    """
    if not names:
        raise ValueError("no checkpoint given")
    run_dir = run_dir.resolve()
    paths = []
    for name in names:
        path = Path(name) if Path(name).is_absolute() else run_dir / name
        path = path.resolve()
        if _WORKER_DIR.match(path.parent.name) and path.parent.parent == run_dir:
            raise ValueError(
                f"{name} is a worker checkpoint; analyse the root (averaged) checkpoint "
                f"{path.name} instead: worker states enter through the consensus analysis"
            )
        if path.parent != run_dir or not ROOT_CHECKPOINT.match(path.name):
            raise ValueError(f"{name}: expected a root checkpoint of {run_dir} (epoch-NNN.safetensors or final.pt)")
        if not path.exists():
            raise ValueError(f"checkpoint {path} does not exist")
        paths.append(path)
    return paths


def _worker_states(path: Path, config: RunConfig) -> tuple[list[dict[str, torch.Tensor]], list[str]]:
    K = config.training.workers
    if path.suffix == ".pt":
        state = load_train_state(path)
        if len(state["workers"]) != K:
            raise ValueError(
                f"{path} holds {len(state['workers'])} worker states, the run has {K}; "
                "supply the worker weights or disable consensus analysis (--no-consensus)"
            )
        return [w["model"] for w in state["workers"]], [f"{path.name}#workers[{w}]" for w in range(K)]
    files = [path.parent / f"node-{w:03d}" / path.name for w in range(K)]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise ValueError(
            f"packed checkpoint {path.name} lacks worker files {missing}; supply the worker "
            "weights or disable consensus analysis (--no-consensus)"
        )
    return [load_weights(f)[0] for f in files], [str(f.relative_to(path.parent)) for f in files]


def _check_average(root: dict[str, torch.Tensor], workers: list[dict[str, torch.Tensor]], source: str) -> None:
    average = average_states(workers)
    for name, tensor in root.items():
        if not torch.allclose(tensor.float(), average[name].float(), rtol=1e-5, atol=1e-7):
            deviation = float((tensor.float() - average[name].float()).abs().max())
            raise ValueError(
                f"{source}: saved root weights {name} differ from the workers' float32 average "
                f"(max deviation {deviation:.3g} > rtol 1e-5, atol 1e-7); the worker files do not "
                "belong to this checkpoint"
            )


def load_state(run_dir: Path, paths: list[Path], config: RunConfig, consensus: bool) -> LoadedState:
    """Load and verify a state and its aliases before any compute (see module docstring)."""
    model = build_model(config.model, attention_backend="reference")
    loaded = None
    for path in paths:
        root, metadata = load_weights(path)
        check_state_dict(model, root, source=str(path))
        alias = {
            "file": path.name,
            "step": int(metadata.get("step", -1)),
            "tokens": int(metadata["tokens"]) if "tokens" in metadata else None,
            **({"source": metadata["source"]} if "source" in metadata else {}),
        }
        digest = state_hash(root)
        if loaded is None:
            loaded = LoadedState(root=root, weights_hash=digest, aliases=[alias])
        elif digest != loaded.weights_hash:
            raise ValueError(
                f"{path.name} and {loaded.aliases[0]['file']} hold different parameter states; "
                "aliases of one state must be identical"
            )
        else:
            loaded.aliases.append(alias)
    if consensus and config.training.packed:
        worker_lists = [_worker_states(path, config) for path in paths]
        for path, (workers, files) in zip(paths, worker_lists, strict=True):
            for state, file in zip(workers, files, strict=True):
                check_state_dict(model, state, source=file)
            _check_average(loaded.root, workers, str(path))
        hashes = [[state_hash(w) for w in workers] for workers, _ in worker_lists]
        if any(h != hashes[0] for h in hashes):
            raise ValueError(
                f"checkpoints {[p.name for p in paths]} share averaged weights but not worker states; "
                "analyse them separately"
            )
        loaded.workers, loaded.worker_files, loaded.worker_hashes = worker_lists[0][0], worker_lists[0][1], hashes[0]
    return loaded


@dataclass(frozen=True)
class _Resolved:
    device: torch.device
    dtype: torch.dtype
    engine: str
    """Engine of the quadratic forms."""
    compiled: bool
    tf32: bool
    hvp_batch_size: int
    hvp_engine: str
    """Engine of Hessian-vector products (spectra)."""
    hvp_compiled: bool


def quadratic_form_engine(settings: AnalysisSettings, model: ModelConfig | None = None) -> str:
    """The engine of the quadratic forms: ``settings.engine``, with auto as adjoint (K > 1 directions
    per pass) or taylor (K = 1), the fastest exact engines measured (benchmarks/README.md); for a
    Hugging Face model of another architecture (``model.architecture: hf``, no second-order rules)
    auto is double_backward, and taylor or adjoint are refused.

    Raises:
        ValueError: a quadratic-form engine for an ``hf`` model, before any work.
    """
    adapted = model is not None and model.architecture == "hf"
    if settings.engine != "auto":
        if adapted and settings.engine not in HVP_ENGINES:
            raise ValueError(f"engine {settings.engine}: {HFCausalLM.jet_refusal}")
        return settings.engine
    if adapted:
        return "double_backward"
    return "adjoint" if settings.directions_per_pass > 1 else "taylor"


def _compiled(settings: AnalysisSettings, engine: str, cuda: bool) -> bool:
    """Whether ``engine`` runs compiled: Pearlmutter on CUDA with compile_hvp."""
    return cuda and settings.compile_hvp and engine == "pearlmutter"


def _resolve(settings: AnalysisSettings, config: RunConfig) -> _Resolved:
    device = resolve_device(settings.device)
    cuda = device.type == "cuda"
    engine = quadratic_form_engine(settings, config.model)
    hvp_engine = (
        engine if engine in HVP_ENGINES else ("pearlmutter" if cuda and settings.compile_hvp else "double_backward")
    )
    return _Resolved(
        device=device,
        dtype=getattr(torch, settings.dtype),
        engine=engine,
        compiled=_compiled(settings, engine, cuda),
        tf32=cuda and settings.dtype == "float32" and settings.tf32,
        hvp_batch_size=settings.hvp_batch_size or config.training.micro_batch_size,
        hvp_engine=hvp_engine,
        hvp_compiled=_compiled(settings, hvp_engine, cuda),
    )


def numerical_settings(settings: AnalysisSettings) -> dict[str, Any]:
    """The settings that decide a result's numbers (all but EXECUTION_SETTINGS)."""
    return {k: v for k, v in asdict(settings).items() if k not in EXECUTION_SETTINGS}


def memory_plan(settings: AnalysisSettings, config: RunConfig, budget_bytes: int | None, cuda: bool) -> MemoryPlan:
    """The grouping of a (state, case) job's passes under ``budget_bytes`` (see
    :func:`tiny_llm.curvature.memory.device_budget`), for a CUDA device or not.

    Raises:
        ValueError: a pass that does not fit even one sequence at a time (nothing is computed).
    """
    engine = quadratic_form_engine(settings, config.model)
    return plan_analysis(
        config.model,
        config.data.seq_len,
        engine=engine,
        K=settings.directions_per_pass,
        hvp_batch_size=settings.hvp_batch_size or config.training.micro_batch_size,
        micro_batch_size=config.training.micro_batch_size,
        itemsize=torch.finfo(getattr(torch, settings.dtype)).bits // 8,
        compiled=_compiled(settings, engine, cuda),
        audit_directions=settings.audit_directions if settings.audited else None,
        extra_vectors=config.training.workers if config.training.packed and settings.consensus else 0,
        budget_bytes=budget_bytes,
    )


def _identity(settings: AnalysisSettings, resolved: _Resolved, config: RunConfig, cache: TokenCache) -> dict:
    numerical = {
        **numerical_settings(settings),
        "device": resolved.device.type,
        "engine": resolved.engine,
        "compiled": resolved.compiled,
        "hvp_engine": resolved.hvp_engine,
        "hvp_compiled": resolved.hvp_compiled,
        "tf32": resolved.tf32,
        "hvp_batch_size": resolved.hvp_batch_size,
        "micro_batch_size": config.training.micro_batch_size,
    }
    execution = {
        "device_kind": resolved.device.type
        if resolved.device.type == "cpu"
        else f"cuda:{torch.cuda.get_device_name(resolved.device)}"
    }
    run = {
        "config": config_to_dict(config) | {"data": {**config_to_dict(config)["data"], "cache": None}},
        "cache_shards": [s["sha256"] for s in cache.meta["shards"]],
    }
    identity = {"source": source_hash(), "settings": numerical, "execution": execution, "run": canonical_hash(run)}
    return {**identity, "hash": canonical_hash(identity)}


def _exclusive(output: Path) -> contextlib.AbstractContextManager:
    return exclusive(output.with_name(f".{output.name}.lock"), f"writing {output}")


def _reusable(output: Path, identity: dict, key: str, case: str) -> dict | None:
    if not output.exists():
        return None
    try:
        old = json.loads(output.read_text())
        same = old["identity"]["hash"] == identity["hash"] and old["state"]["key"] == key and old["case"] == case
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(
            f"{output} exists but is not a tiny-llm result; remove it or use a new output directory"
        ) from None
    if not same:
        raise ValueError(f"{output} holds a result with other settings, source or state; use a new output directory")
    return old


def _case_plan(config: RunConfig, cache: TokenCache, case: str, run_dir: Path, offset: int):
    if case not in CASES:
        raise ValueError(f"case: expected one of {', '.join(CASES)}, got {case!r}")
    if case == "offset":
        return offset_plan(config, cache, offset)
    if (run_dir / IMPORTED).exists():
        raise ValueError(
            f"case {case}: {run_dir} holds imported weights, trained elsewhere on a stream this "
            "project does not know, so seen and unseen do not apply; analyse the offset case "
            "(a batch-aligned epoch of the cache from data_offset)"
        )
    check_capacity(cache, config, "unseen" if case == "unseen" else "train")
    return epoch_plan(config, 1) if case == "seen" else unseen_plan(config)


def check_tokenizer(run_dir: Path, cache: TokenCache, carried: dict[str, Any] | None) -> None:
    """Refuse to measure a run's checkpoints on a cache encoded with another tokenizer than the one
    they came with (``carried``: :func:`run_tokenizer` of an imported run), naming both.

    Raises:
        ValueError: before any work.
    """
    if carried is not None and not same_tokenizer(carried, cache.meta.get("tokenizer")):
        raise ValueError(
            f"{run_dir}'s checkpoints came with {describe_tokenizer(carried)}, but the cache "
            f"{cache.path} was encoded with {describe_tokenizer(cache.meta.get('tokenizer'))}; prepare "
            f"the cache with the checkpoints' tokenizer (prepare-data --source text --tokenizer "
            f"{carried.get('path')} ...) and point data.cache at it"
        )


def prepare_inputs(
    run_dir: str | Path, checkpoints: list[str], case: str, settings: AnalysisSettings, expect_key: str | None = None
):
    """Everything a worker checks before computing: configuration, resolved precision, cache and
    its capacity, the case's batch plan, and the verified state (matching ``expect_key``).

    Returns ``(config, resolved, cache, plan, state)``.
    """
    run_dir = Path(run_dir)
    config = load_config(run_dir / RESOLVED)
    carried = run_tokenizer(run_dir)  # an import that did not finish is refused first
    resolved = _resolve(settings, config)
    cache = TokenCache(config.data.cache)
    cache.check_layout(config)
    check_tokenizer(run_dir, cache, carried)
    plan = _case_plan(config, cache, case, run_dir, settings.data_offset)
    state = load_state(run_dir, resolve_checkpoints(run_dir, checkpoints), config, settings.consensus)
    if expect_key is not None and state.key != expect_key:
        raise ValueError(
            f"checkpoints {checkpoints} hash to state key {state.key}, expected {expect_key}; "
            "the files changed since the states were indexed"
        )
    return config, resolved, cache, plan, state


def analyze_state(
    run_dir: str | Path,
    checkpoints: list[str],
    case: str,
    settings: AnalysisSettings,
    output: str | Path,
    expect_key: str | None = None,
) -> dict[str, Any]:
    """Measure one state on one case and write the result JSON atomically; returns the result.

    Raises:
        ValueError: any bad input (see module docstring); nothing is written.
    """
    output = Path(output)
    check_writable_file(output)
    config, resolved, cache, plan, state = prepare_inputs(run_dir, checkpoints, case, settings, expect_key)
    identity = _identity(settings, resolved, config, cache)
    memory = memory_plan(
        settings, config, device_budget(resolved.device, settings.memory_budget_gb), cuda=resolved.device.type == "cuda"
    )
    with single_writer(output) as reuse:
        if (old := reuse(lambda: _reusable(output, identity, state.key, case))) is not None:
            log.info("reusing %s (same identity)", output)
            return old
        log.info("%s", memory.describe())
        result = _measure(config, cache, plan, state, case, settings, resolved, identity, memory)
        if is_writer():
            atomic_write_json(output, result)
    return result


@contextlib.contextmanager
def single_writer(output: Path) -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """The write of ``output`` by one rank: rank 0 holds its lock (and clears a killed write's
    temporary files) while every rank computes; the decision to reuse a finished result is rank
    0's, shared with all (they must all compute, or none). Every rank leaves together, after the
    write. Yields ``reuse(check)``: the value of ``check()`` on rank 0, on every rank."""
    lock = _exclusive(output) if is_writer() else contextlib.nullcontext()
    failed = False
    with lock:
        if is_writer():
            remove_leftovers(output.parent, output.name)
        try:
            yield lambda check: broadcast(check() if is_writer() else None)
        except BaseException:
            failed = True
            raise
        finally:
            if not failed:
                barrier()


@contextlib.contextmanager
def explain_out_of_memory(hvp_batch_size: int, directions_per_pass: int) -> Iterator[None]:
    """Turn the device running out of memory into the one-line error that names the settings to
    lower (nothing is shrunk silently; the caller has written nothing yet).

    Raises:
        ValueError: on ``torch.OutOfMemoryError`` inside the block.
    """
    try:
        yield
    except torch.OutOfMemoryError:
        raise ValueError(
            f"out of memory with --hvp-batch-size {hvp_batch_size} and --directions-per-pass "
            f"{directions_per_pass} although the memory model said they fit; set a smaller "
            "memory_budget_gb (--memory-budget-gb) so that the passes are cut finer, or lower "
            f"them (e.g. {max(1, hvp_batch_size // 2)} and {max(1, directions_per_pass // 2)}); "
            "nothing was written"
        ) from None


def _measure(
    config: RunConfig,
    cache: TokenCache,
    plan,
    state: LoadedState,
    case: str,
    settings: AnalysisSettings,
    resolved: _Resolved,
    identity: dict,
    memory: MemoryPlan,
) -> dict[str, Any]:
    started = time.perf_counter()
    precision = Precision(resolved.device, resolved.dtype, settings.amp)
    model = build_model(config.model, attention_backend="reference")
    model.load_state_dict(state.root, strict=True)
    model.to(device=resolved.device, dtype=resolved.dtype)
    flat = FlatParameters(model)
    root_flat = flat.flatten_state(state.root).double()
    consensus = [(w, flat.flatten_state(worker).double() - root_flat) for w, worker in enumerate(state.workers)]
    inputs = CaseInputs(
        cache=cache,
        plan=plan,
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=resolved.hvp_batch_size,
        noise_samples=settings.noise_samples,
        random_samples=settings.random_samples,
        seed=settings.seed,
        engine=resolved.engine,
        directions_per_pass=settings.directions_per_pass,
        compile=resolved.compiled,
        workers=config.training.workers,
        consensus=consensus,
        audit=(settings.audit_directions, settings.audit_batches) if settings.audited else None,
        memory=memory,
    )
    label = f"[{state.key[:12]} {case}]"
    with (
        runtime_settings(resolved.device, resolved.tf32) as runtime,
        explain_out_of_memory(resolved.hvp_batch_size, settings.directions_per_pass),
    ):
        measured = measure_case(model, inputs, precision, progress=lambda m: log.info("%s %s", label, m))
    return {
        "schema": RESULT_SCHEMA,
        "identity": identity,
        "state": {
            "key": state.key,
            "weights_hash": state.weights_hash,
            "aliases": state.aliases,
            "worker_hashes": state.worker_hashes or None,
            "worker_files": state.worker_files or None,
        },
        "case": case,
        "settings": settings_record(settings),
        "precision": {
            "device": str(resolved.device),
            "dtype": settings.dtype,
            "tf32": resolved.tf32,
            "amp": settings.amp,
            "amp_dtype": "bfloat16" if settings.amp else None,
            "engine": resolved.engine,
            "quadratic_form_engine": resolved.engine,
            "compiled": resolved.compiled,
            "attention_backend": "reference",
            "reductions": "float64",
            **runtime,
        },
        "timing": {**measured["timing"], "wall_seconds": time.perf_counter() - started, "compile": compile_record()},
        "memory": memory.record(),
        "counts": measured["counts"],
        "statistics": measured["statistics"],
        "standard_errors": measured["standard_errors"],
        "audit": measured["audit"],
        "noise_samples": measured["noise_samples"],
        "random_directions": measured["random_directions"],
        "consensus": measured["consensus"],
        "data": {
            "cache": str(cache.path),
            "tokenizer": cache.meta["tokenizer"],
            "source": cache.meta["source"],
            "shards": [{"file": s["file"], "sha256": s["sha256"]} for s in cache.meta["shards"]],
            "plan": plan.name,
            "stream_batches": [int(plan.stream_batches[0]), int(plan.stream_batches[-1])],
            "seq_len": config.data.seq_len,
            "order": order_report(cache, plan),
        },
        "software": software(),
        "hardware": hardware(resolved.device),
        "parallel": parallel_record(),
        "slurm": slurm_job(),
    }


def settings_record(settings: AnalysisSettings) -> dict[str, Any]:
    """The settings as a result records them: plain data, with every batch as ``noise_samples: all``
    (as written in a configuration)."""
    record = asdict(settings)
    if record["noise_samples"] is None:
        record["noise_samples"] = "all"
    return record


def settings_from_dict(data: dict[str, Any]) -> AnalysisSettings:
    """AnalysisSettings from plain config data (``noise_samples: all`` means every batch).

    Raises:
        ValueError: unknown keys or impossible values, naming them.
    """
    names = set(AnalysisSettings.__dataclass_fields__)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown analysis settings {unknown}; allowed: {sorted(names)}")
    values = dict(data)
    if values.get("noise_samples") == "all":
        values["noise_samples"] = None
    return AnalysisSettings(**values)


def output_binding(settings: AnalysisSettings, run: str, spectrum: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an output directory is bound to: the run, the settings (spectral ones too) and the
    tiny_llm source."""
    return {
        "run": str(run),
        "settings": numerical_settings(settings),
        "spectrum": spectrum or {},
        "source": source_hash(),
    }


def holds_results(output_dir: str | Path) -> bool:
    """Whether an output directory holds any finished measurement (state or spectrum results, or a
    collected summary)."""
    root = Path(output_dir)
    return (root / SUMMARY).exists() or any(root.glob("states/*/*.json")) or any(root.glob("spectra/*/*.json"))


def check_output_binding(output_dir: str | Path, binding: dict[str, Any], write: bool = False) -> None:
    """Refuse an output directory whose results were made with another run, other settings or other
    source code. A binding with no result yet (a first attempt that failed) does not hold: it is
    replaced, with a log line saying what changed.

    With ``write``, record the binding (identity.json) when the directory has none yet, or replace
    one that binds no result.

    Raises:
        ValueError: naming what changed and what to do (a new name, the old settings, or removing
            the results).
    """
    path = Path(output_dir) / "identity.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
            old["run"], old["settings"], old["source"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{path} is damaged (not the binding of an output directory); restore it, or remove "
                f"{output_dir} (its results) or use a new analysis name"
            ) from None
        changed = [f"run: {old['run']} -> {binding['run']}"] if old["run"] != binding["run"] else []

        def shown(key: str, value: Any) -> str:
            return "all" if key == "noise_samples" and value is None else repr(value)

        changed += [
            f"settings.{k}: {shown(k, old['settings'].get(k))} -> {shown(k, v)}"
            for k, v in binding["settings"].items()
            if old["settings"].get(k) != v
        ]
        changed += [
            f"spectrum.{k}: {old.get('spectrum', {}).get(k)!r} -> {v!r}"
            for k, v in binding["spectrum"].items()
            if old.get("spectrum", {}).get(k) != v
        ]
        if old["source"] != binding["source"]:
            changed.append("the tiny_llm source code changed")
        if changed and not holds_results(output_dir):
            if write:
                atomic_write_json(path, binding)
                log.info(
                    "%s held no result yet: its binding now follows the changed settings (%s)",
                    output_dir,
                    "; ".join(changed),
                )
            return
        if changed:
            fix = (
                f"use a new output directory (a new analysis name), restore the settings, or remove {output_dir} "
                "(its results) to recompute it with these settings"
            )
            if changed == ["the tiny_llm source code changed"]:
                fix = (
                    f"use a new analysis name, or remove {output_dir} to recompute it with this code "
                    "(or go back to the code that made it)"
                )
            raise ValueError(f"{output_dir} holds results made with other settings ({'; '.join(changed)}); {fix}")
    elif write:
        atomic_write_json(path, binding)
