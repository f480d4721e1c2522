"""Everything a worker checks before it computes: the resolved precision and engines, the
checkpoints (root checkpoints only, identical aliases, strict names and shapes, finite weights,
packed workers present and consistent with the saved average), the cache (layout, tokenizer,
capacity) and the case's batch plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_llm.architectures import build_model
from tiny_llm.config import RunConfig, load_config
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.curvature.memory_measure import device_budget
from tiny_llm.curvature.placement import held_shards
from tiny_llm.data.corpus import describe_tokenizer, same_tokenizer
from tiny_llm.data.tokens import (
    BatchPlan,
    TokenCache,
    check_capacity,
    epoch_plan,
    offset_plan,
    stream_batches,
    unseen_plan,
)
from tiny_llm.data.training_order import ORDER_CASES, OrderCase, TrainingOrder, check_window, order_plan
from tiny_llm.layout import IMPORTED, RESOLVED
from tiny_llm.model.checkpoint import check_state_dict, load_train_state, load_weights, state_hash
from tiny_llm.model.hf_runs import run_tokenizer
from tiny_llm.provenance import canonical_hash
from tiny_llm.runtime import resolve_device
from tiny_llm.shapes import Rows
from tiny_llm.training.loop import average_states
from tiny_llm.workers.resolution import Resolution, memory_plan, resolve
from tiny_llm.workers.selection import resolve_checkpoints
from tiny_llm.workers.settings import CASES, AnalysisSettings


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
class Resolved(Resolution):
    """A job's resolution (:class:`Resolution`) with the device and dtype it runs on."""

    device: torch.device
    dtype: torch.dtype


def resolve_job(settings: AnalysisSettings, config: RunConfig) -> Resolved:
    """Resolve a job's settings for its run on this machine (device, engines, compilation), once."""
    device = resolve_device(settings.device)
    resolution = resolve(settings, config, cuda=device.type == "cuda")
    return Resolved(**asdict(resolution), device=device, dtype=getattr(torch, settings.dtype))


def job_memory_plan(settings: AnalysisSettings, config: RunConfig, resolved: Resolved) -> MemoryPlan:
    """The memory plan of this job (:func:`tiny_llm.workers.resolution.memory_plan`) on its device,
    under its budget, over its ranks."""
    budget = device_budget(resolved.device, settings.memory_budget_gb)
    cuda = resolved.device.type == "cuda"
    return memory_plan(settings, config, budget, cuda=cuda, ranks=held_shards(settings.sharded), resolution=resolved)


def _case_plan(config: RunConfig, cache: TokenCache, case: str, run_dir: Path, offset: int, steps: tuple):
    if case not in CASES:
        raise ValueError(f"case: expected one of {', '.join(CASES)}, got {case!r}")
    if case == "offset":
        return offset_plan(config, cache, offset)
    if case == "recent":
        raise ValueError("case recent: a window of a published training order; give the suite's training_order")
    if (run_dir / IMPORTED).exists():
        raise ValueError(
            f"case {case}: {run_dir} holds imported weights, trained elsewhere on a stream this "
            "project does not know, so seen and unseen do not apply; analyse the offset case "
            "(a batch-aligned epoch of the cache from data_offset)"
        )
    check_capacity(cache, config, "unseen" if case == "unseen" else "train")
    if case == "step":
        return _step_plan(config, *steps)
    return epoch_plan(config, 1) if case == "seen" else unseen_plan(config)


def _step_plan(config: RunConfig, step: int, next_step: int | None) -> BatchPlan:
    """The batches a run trained here took from step ``step`` on, towards ``next_step`` (at most an
    epoch of them); after the last state (``next_step`` None), the unseen case's.

    Raises:
        ValueError: a packed run (its workers trained on batches of their own), or a step beyond
            training.
    """
    if config.training.packed is not None:
        raise ValueError("case step: a packed run's workers each trained on their own batches; use seen and unseen")
    if next_step is None:
        return unseen_plan(config)
    count = min(config.steps_per_epoch, next_step - step)
    if step < 0 or count < 1 or step + count > config.steps_per_epoch * config.training.epochs:
        raise ValueError(f"case step: steps {step + 1}..{step + count} are not steps this run trained")
    return BatchPlan(
        f"steps {step + 1}..{step + count}", stream_batches(config, step, count), np.arange(step, step + count)
    )


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
    run_dir: str | Path,
    checkpoints: list[str],
    case: str,
    settings: AnalysisSettings,
    expect_key: str | None = None,
    order: dict[str, Any] | None = None,
    successor: dict[str, Any] | None = None,
):
    """Everything a worker checks before computing: configuration, resolved precision, cache and
    its capacity (or, for a case of a published training order, ``order``: that order and its
    window as plain data, :class:`OrderCase`), the case's batch plan, the verified state (matching
    ``expect_key``) and its ``successor`` (:func:`load_successor`; its step ends the ``step`` case).

    Returns ``(config, resolved, source, plan, state, following)``: the source is the token cache or
    the training order, either giving a batch's tokens (``tokens``) and a sequence's place
    (``position``); ``following``: the loaded successor, or None.
    """
    order = OrderCase.from_dict(order) if order is not None else None
    next_step = None if successor is None else successor.get("step")
    run_dir = Path(run_dir)
    config = load_config(run_dir / RESOLVED)
    carried = run_tokenizer(run_dir)  # an import that did not finish is refused first
    resolved = resolve_job(settings, config)
    state = load_state(run_dir, resolve_checkpoints(run_dir, checkpoints), config, settings.consensus)
    if order is not None:
        source, plan = _order_plan(config, case, order)
    else:
        source = TokenCache(config.data.cache)
        source.check_layout(config)
        check_tokenizer(run_dir, source, carried)
        steps = (min(int(a["step"]) for a in state.aliases), next_step)
        plan = _case_plan(config, source, case, run_dir, settings.data_offset, steps)
    if expect_key is not None and state.key != expect_key:
        raise ValueError(
            f"checkpoints {checkpoints} hash to state key {state.key}, expected {expect_key}; "
            "the files changed since the states were indexed"
        )
    if order is not None:
        check_window(case, order.window, min(a["step"] for a in state.aliases))
    return config, resolved, source, plan, state, load_successor(run_dir, successor, config, state)


def load_successor(
    run_dir: str | Path, successor: dict[str, Any] | None, config: RunConfig, state: LoadedState | None = None
) -> tuple[dict[str, Any], LoadedState] | None:
    """The next state of an analysis (``{"key", "file", "step"}`` as the planner names it), loaded and
    verified as any state is (its root weights: the step's end), or None.

    Raises:
        ValueError: a successor that is ``state`` itself, or trained no later than it, naming it.
    """
    if successor is None:
        return None
    run_dir = Path(run_dir)
    following = load_state(run_dir, resolve_checkpoints(run_dir, [successor["file"]]), config, False)
    if state is not None:
        if following.weights_hash == state.weights_hash:
            raise ValueError(
                f"successor {successor['file']}: the same weights as the state measured, so there is no step to "
                "measure along; name the next checkpoint"
            )
        here, there = _step(state.aliases), _step(following.aliases)
        if here is not None and there is not None and there <= here:
            raise ValueError(
                f"successor {successor['file']}: trained to step {there}, not after this state's step {here}; "
                "name the next checkpoint"
            )
    return successor, following


def _step(aliases: list[dict[str, Any]]) -> int | None:
    """A state's training step, from its first alias (None where unknown)."""
    step = aliases[0].get("step") if aliases else None
    return int(step) if isinstance(step, int | float | str) and str(step).lstrip("-").isdigit() else None


def step_vector(
    state: LoadedState, successor: tuple[dict[str, Any], LoadedState] | None, names: list[str], rows: Rows
) -> torch.Tensor | None:
    """Δ = θ' − θ between the stored checkpoints, float64 in the order of ``names``: this rank's
    ``rows`` (the job's layout: as every parameter-sized vector), or None without a successor."""
    if successor is None:
        return None
    return rows.cut([successor[1].root[n].double() - state.root[n].double() for n in names])


def _order_plan(config: RunConfig, case: str, order: OrderCase) -> tuple[TrainingOrder, BatchPlan]:
    """The training order and the batch plan of its case's window."""
    if case not in ORDER_CASES:
        raise ValueError(f"case {case}: a training order's cases are {', '.join(ORDER_CASES)}")
    source = TrainingOrder(order.spec, config.model.vocab_size)
    try:
        source.check_sequence_length(config.data.seq_len)
    except ValueError as error:
        raise ValueError(f"training_order: {error}") from None
    return source, order_plan(source, order.window, order.batch_sequences)
