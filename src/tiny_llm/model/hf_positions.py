"""Where each checkpoint of a suite trained elsewhere stands in its training: its optimizer step and
the tokens it had seen, given, read from a ``transformers`` Trainer's ``trainer_state.json``,
derived from the step, or unknown (then the figures use steps, and a warning says how to give
them); never the rounded count a revision's name states (``tokens4B``), which only checks them.
Checkpoints must be listed oldest first. A Trainer's logged training loss and gradient norms
(``log_history``) become the run's training log (:func:`trainer_log`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from tiny_llm.layout import TRAINER_LOG_SOURCE
from tiny_llm.model.hf import read_json_object
from tiny_llm.model.hub import revision_position, tokens_rounding

__all__ = [
    "as_written",
    "CheckpointPosition",
    "CheckpointSource",
    "checkpoint_positions",
    "read_trainer_state",
    "trainer_log",
    "warn_unknown_tokens",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointSource:
    """One checkpoint folder to import, and what is stated of it: its step and tokens when given,
    and the hub repository and revision it was resolved from (the revision's name may carry the
    step and tokens)."""

    path: Path
    step: int | None = None
    tokens: int | None = None
    repo: str | None = None
    revision: str | None = None

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> CheckpointSource:
        """From a configuration's (expanded) ``hf_checkpoints`` entry."""
        fields = ("step", "tokens", "repo", "revision")
        return cls(Path(entry["path"]), **{k: entry.get(k) for k in fields})

    def record(self) -> dict[str, Any]:
        """Where it came from, for the import's record."""
        return {
            "source": str(self.path.resolve()),
            **({"repo": self.repo, "revision": self.revision} if self.repo else {}),
        }


def as_written(message: str, sources: list[CheckpointSource]) -> str:
    """``message`` with each hub revision's snapshot folder it names named as the configuration does
    too: ``ORG/NAME revision REV at FOLDER`` (a snapshot's hash alone says nothing to its user)."""
    for source in sources:
        written = f"{source.repo} revision {source.revision}"
        if source.repo and source.revision and written not in message:
            message = message.replace(str(source.path), f"{written} at {source.path}", 1)
    return message


@dataclass(frozen=True)
class CheckpointPosition:
    """Where an imported checkpoint stands in its training, and where each number came from."""

    step: int
    step_source: str
    tokens: int | None
    """Training tokens seen; None when unknown."""
    tokens_source: str

    def record(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "step_source": self.step_source,
            "tokens": self.tokens,
            "tokens_source": self.tokens_source,
        }


def read_trainer_state(directory: Path) -> dict[str, Any] | None:
    """A Trainer's ``trainer_state.json`` beside a checkpoint, or None when there is none.

    Raises:
        ValueError: the file is there but is not a JSON object with an integer global_step.
    """
    path = Path(directory) / "trainer_state.json"
    if not path.exists():
        return None
    data = read_json_object(path)
    step = data.get("global_step")
    if not _is_count(step):
        raise ValueError(
            f"{path}: global_step {step!r} is not a non-negative integer; fix the file or give the "
            "step (--step, hf_checkpoints[].step)"
        )
    return data


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any, what: str) -> int:
    if not _is_count(value):
        raise ValueError(f"{what}: expected a non-negative integer, got {value!r}")
    return value


def _position(
    source: CheckpointSource, state: dict | None, tokens_per_step: int | None, alone: bool
) -> CheckpointPosition:
    """One directory's step and tokens: given, from its trainer_state.json, from its revision's
    name, derived or unknown."""
    path, step, count, revision = source.path, source.step, source.tokens, source.revision
    named_step, named_tokens = revision_position(revision) if revision else (None, None)
    if step is not None:
        step, step_source = _count(step, f"step of {path}"), "given"
    elif state is not None:
        step, step_source = state["global_step"], "trainer_state.json global_step"
    elif named_step is not None:
        step, step_source = named_step, f"revision name {revision}"
    elif not alone:
        raise ValueError(
            f"{path}: its training step is unknown (no trainer_state.json, no step in a revision's name); "
            "give the step of every checkpoint (--step S1 S2 ..., hf_checkpoints[].step)"
        )
    else:
        step, step_source = 0, "unknown"
    seen_tokens = (state or {}).get("num_input_tokens_seen")
    if seen_tokens is not None and not _is_count(seen_tokens):
        raise ValueError(
            f"{Path(path) / 'trainer_state.json'}: num_input_tokens_seen {seen_tokens!r} is not a count of tokens; "
            "correct it, or give the checkpoint's tokens (--tokens, hf_checkpoints[].tokens)"
        )
    if count is not None:
        count, tokens_source = _count(count, f"tokens of {path}"), "given"
        if tokens_per_step is not None and step * tokens_per_step != count:
            raise ValueError(
                f"tokens_per_step {tokens_per_step} puts {path} (step {step}) at {step * tokens_per_step} tokens, "
                f"but its tokens are given as {count}; correct one of them (or drop tokens_per_step)"
            )
    elif _is_count(seen_tokens) and seen_tokens > 0:
        count, tokens_source = seen_tokens, "trainer_state.json num_input_tokens_seen"
        if tokens_per_step is not None and step * tokens_per_step != seen_tokens:
            raise ValueError(
                f"tokens_per_step {tokens_per_step} puts step {step} at {step * tokens_per_step} tokens, but "
                f"{Path(path) / 'trainer_state.json'} counted {seen_tokens} (num_input_tokens_seen); "
                "drop tokens_per_step (the Trainer's count is used) or correct it"
            )
    elif tokens_per_step is not None and step_source != "unknown":
        count, tokens_source = step * tokens_per_step, f"step x tokens_per_step ({tokens_per_step})"
        _check_named_tokens(revision, named_tokens, count)
    elif named_tokens is not None:  # a name rounds its tokens (tokens4B: 4B ± 0.5B): never taken as the count
        raise ValueError(
            f"{path}: revision {revision} states its tokens only rounded (± {tokens_rounding(revision):g}), "
            "which is no token axis; give tokens_per_step (tokens in one optimizer step: an analysis's or seed "
            "experiment's tokens_per_step, --tokens-per-step, or an analysis's training_order, which gives it; "
            "checked against every name) or each checkpoint's tokens (hf_checkpoints[].tokens, --tokens)"
        )
    else:
        count, tokens_source = None, "unknown"
    return CheckpointPosition(step, step_source, count, tokens_source)


def _check_named_tokens(revision: str | None, named: int | None, count: int) -> None:
    """A revision's name that states its tokens must agree with step x tokens_per_step (to the
    name's rounding)."""
    if named is not None and abs(count - named) > tokens_rounding(revision):
        raise ValueError(
            f"tokens_per_step puts revision {revision} at {count} tokens, but its name says {named} "
            f"(± {tokens_rounding(revision):g}); correct tokens_per_step"
        )


def _check_order(paths: list[Path], positions: list[CheckpointPosition]) -> None:
    """Steps (and known tokens) must increase in the order given."""
    for (a, p), (b, q) in pairwise(zip(paths, positions, strict=True)):
        if q.step <= p.step:
            raise ValueError(
                f"checkpoints out of training order: {b} (step {q.step}) comes after {a} (step {p.step}); "
                "list them oldest first, each step once"
            )
        if p.tokens is not None and q.tokens is not None and q.tokens <= p.tokens:
            raise ValueError(
                f"checkpoints out of training order, the training tokens do not increase with the step: {b} "
                f"(step {q.step}, {q.tokens} tokens, "
                f"{q.tokens_source}) comes after {a} (step {p.step}, {p.tokens} tokens, {p.tokens_source}); "
                "list the checkpoints oldest first and correct their tokens (or give tokens_per_step)"
            )


def warn_unknown_tokens(paths: list[Path], positions: list[CheckpointPosition]) -> None:
    """A warning naming the checkpoints whose training tokens are unknown, with what their
    trainer_state.json says about the batch (said once everything else is checked, so a refusal
    is the one line a user reads)."""
    unknown = [str(path) for path, p in zip(paths, positions, strict=True) if p.tokens is None]
    if unknown:
        states = [read_trainer_state(path) for path in paths]
        batch = next((s.get("train_batch_size") for s in states if s), None)
        hint = (
            f"; trainer_state.json says train_batch_size {batch} per device, so tokens_per_step = {batch} x "
            "sequence length x gradient accumulation steps x devices"
            if batch
            else ""
        )
        log.warning(
            "training tokens unknown for %s: the figures will use steps; give them (--tokens, "
            "--tokens-per-step, hf_checkpoints[].tokens or tokens_per_step)%s",
            ", ".join(unknown),
            hint,
        )


def checkpoint_positions(
    sources: list[CheckpointSource], tokens_per_step: int | None = None
) -> list[CheckpointPosition]:
    """Each directory's step and training tokens, in the order given (oldest first).

    A step is given, or a Trainer's ``trainer_state.json`` global_step, or what its hub revision's
    name says (``step1000``; ``stage1-step1000-tokens4B``); tokens are given, or its
    ``num_input_tokens_seen``, or step × ``tokens_per_step`` (checked against a name that states
    them), or unknown (None; ``warn_unknown_tokens`` says so); a name's own tokens are rounded
    (``tokens4B``), so a checkpoint whose only count is its name's is refused, naming
    ``tokens_per_step``. Tokens must increase strictly with the step. A single directory without a
    step gets step 0, said to be unknown.

    Raises:
        ValueError: no directory, a directory given twice, steps unknown for several
            directories, tokens only a name's rounded ones, or steps (tokens) that do not increase
            in the order given.
    """
    paths, n = [s.path for s in sources], len(sources)
    if not n:
        raise ValueError("no checkpoint directory given")
    seen: dict[Path, Path] = {}
    for path in paths:
        if (resolved := Path(path).resolve()) in seen:
            raise ValueError(f"checkpoint directory {path} is given twice (as {seen[resolved]} too); list each once")
        seen[resolved] = path
    if tokens_per_step is not None and (_count(tokens_per_step, "tokens_per_step") == 0):
        raise ValueError("tokens_per_step: expected a positive integer (tokens in one optimizer step), got 0")
    states = [read_trainer_state(path) for path in paths]
    positions = [
        _position(source, state, tokens_per_step, n == 1) for source, state in zip(sources, states, strict=True)
    ]
    _check_order(paths, positions)
    return positions


def trainer_log(paths: list[Path], tokens_per_step: int | None = None) -> tuple[Path, list[dict[str, Any]]] | None:
    """The training log a ``transformers`` Trainer kept, as the records of a run's training log:
    the ``log_history`` of the newest checkpoint that has a trainer_state.json (each holds every
    entry up to its step), its training entries (those with a ``loss``) in order, each with
    ``step``, ``epoch``, ``tokens`` (its ``num_input_tokens_seen``, else step × ``tokens_per_step``,
    else none), ``lr``, ``loss`` (the Trainer's mean over its logging interval), ``grad_norm``
    (before clipping, as the Trainer logs it) and ``source``. Returns (that trainer_state.json,
    records), or None when no checkpoint has one or it logged no training loss.

    Raises:
        ValueError: a log_history that is not a list, or a training entry whose step or loss is
            not a number, naming the file and the entry.
    """
    for path in reversed(paths):
        state = read_trainer_state(path)
        if state is None:
            continue
        file = Path(path) / "trainer_state.json"
        history = state.get("log_history", [])
        if not isinstance(history, list):
            raise ValueError(f"{file}: log_history is not a list; fix the file or remove log_history")
        records = []
        for index, entry in enumerate(history):
            if not isinstance(entry, dict) or "loss" not in entry:
                continue  # evaluation entries, the final summary
            step, loss = entry.get("step"), entry.get("loss")
            if not _is_count(step) or not isinstance(loss, int | float) or isinstance(loss, bool):
                raise ValueError(
                    f"{file}: log_history entry {index} has step {step!r} and loss {loss!r}, not numbers; "
                    "fix the file or remove the entry"
                )
            if records and step <= records[-1]["step"]:
                raise ValueError(
                    f"{file}: log_history entry {index} (step {step}) does not come after step "
                    f"{records[-1]['step']}; fix the file or remove the entry"
                )
            if _is_count(last := state.get("global_step")) and step > last:
                raise ValueError(
                    f"{file}: log_history entry {index} is at step {step}, past the global_step {last} "
                    "the checkpoint was saved at; fix the file or remove the entry"
                )
            record: dict[str, Any] = {"step": step}
            if _is_number(entry.get("epoch")):
                record["epoch"] = float(entry["epoch"])
            if _is_count(seen := entry.get("num_input_tokens_seen")) and seen > 0:
                record["tokens"] = seen
            elif tokens_per_step is not None:
                record["tokens"] = step * tokens_per_step
            if _is_number(entry.get("learning_rate")):
                record["lr"] = float(entry["learning_rate"])
            record["loss"] = float(loss)  # a diverged step's NaN stays NaN
            if _is_number(entry.get("grad_norm")):
                record.update(grad_norm=float(entry["grad_norm"]), grad_norm_kind="pre_clip")
            records.append({**record, "source": TRAINER_LOG_SOURCE})
        return (file, records) if records else None
    return None
