"""The published training order of an analysis of a suite trained elsewhere, planned before any
work: the order opened and checked (its files, its index, its length), and the window of training
steps each case reads at each analysed checkpoint (``seen``, ``unseen``, ``recent``), checked
against every checkpoint's step at start-up. Each (state, case) job is given its window as plain
data (:meth:`OrderPlan.job`).

An analysis's keys: ``training_order`` (``{path, format, sequences_per_step, sequence_tokens,
order, dtype}``), ``case_steps`` (the window's training steps: the case's epoch; default 1) and
``batch_sequences`` (the sequences of one batch of the noise samples: a divisor of a training step's
batch; by default the largest that cuts the window into at least :data:`NOISE_BATCHES` batches). A
window that would be a single batch is refused: one batch gives no noise estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tiny_llm.config import RunConfig
from tiny_llm.curvature.statistics import NOISE_BATCHES
from tiny_llm.data.training_order import (
    ORDER_CASES,
    OrderCase,
    TrainingOrder,
    TrainingOrderSpec,
    case_window,
    check_window,
)
from tiny_llm.declared import build

__all__ = [
    "NOISE_BATCHES",
    "JobOrder",
    "OrderPlan",
    "default_batch_sequences",
    "following_state",
    "plan_order",
    "state_step",
]


@dataclass(frozen=True)
class JobOrder:
    """A (state, case) job's training-order case as a rule parameter (None: the run's token cache).

    An object, not plain data, so that Snakemake leaves it out of its comparison of parameters:
    results made before the parameter existed are not rerun for it; a changed order is refused at
    start-up by the output directory's binding, and a changed window by the result's identity."""

    case: dict[str, Any] | None


@dataclass(frozen=True)
class JobSuccessor:
    """A (state, case) job's next state in its analysis (the trajectory statistics' θ'), as a rule
    parameter: ``{"key", "file", "step"}`` of its first checkpoint file, or None (the last state, or
    ``trajectory: false``). An object for the reason :class:`JobOrder` is; a changed successor is
    refused by the result on reuse."""

    state: dict[str, Any] | None


@dataclass(frozen=True)
class OrderPlan:
    """An analysis's training order, its window length and batch, and the steps it analyses."""

    spec: TrainingOrderSpec
    steps: int
    """Training steps of each case's window."""
    batch_sequences: int
    """Sequences of one noise batch (a divisor of ``spec.sequences_per_step``)."""
    analysed: tuple[int, int]
    """(earliest, latest) step of the analysed checkpoints."""

    @property
    def epoch(self) -> tuple[int, int]:
        """A window's (noise batches, sequences a batch): what a (state, case) job measures."""
        return self.steps * self.spec.sequences_per_step // self.batch_sequences, self.batch_sequences

    def window(self, case: str, step: int, next_step: int | None = None) -> tuple[int, int]:
        """(first, last) step of ``case``'s window for the checkpoint at ``step`` (``next_step``: the
        next analysed checkpoint's, for the ``step`` case)."""
        return case_window(case, step, self.analysed, self.steps, next_step)

    def job(self, case: str, step: int, next_step: int | None = None) -> dict[str, Any]:
        """What a (state, case) job of a checkpoint at ``step`` is given (:class:`OrderCase`)."""
        return OrderCase(self.spec, self.window(case, step, next_step), self.batch_sequences).to_dict()

    def binding(self) -> dict[str, Any]:
        """What an analysis's results are bound to of its order, keyed as the configuration is (a
        change of any of them is refused at start-up): the order as given, the window's steps and
        the noise batch as resolved."""
        return {
            "training_order": dataclasses.asdict(self.spec),
            "case_steps": self.steps,
            "batch_sequences": self.batch_sequences,
        }


def default_batch_sequences(sequences_per_step: int, steps: int) -> int:
    """The largest divisor of a training step's batch that cuts a window of ``steps`` steps into at
    least :data:`NOISE_BATCHES` noise batches (1 when none does)."""
    window = sequences_per_step * steps
    fitting = [
        b for b in range(1, sequences_per_step + 1) if sequences_per_step % b == 0 and window // b >= NOISE_BATCHES
    ]
    return max(fitting, default=1)


def plan_order(key: str, entry: dict[str, Any], cases: list[str], steps: list[int], run: RunConfig) -> OrderPlan:
    """The order of an analysis entry (``key``: its config key), with every case's window checked
    against every analysed checkpoint's ``steps`` and the data's length.

    Raises:
        ValueError: naming the key: a malformed order, missing or damaged files, a window a
            checkpoint has not reached, or has contrary to its case, or one beyond the data.
    """
    try:
        spec = build(TrainingOrderSpec, dict(entry["training_order"]), f"{key}.training_order.")
        order = TrainingOrder(spec, run.model.vocab_size)
        order.check_sequence_length(run.data.seq_len)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{key}.training_order: {error}") from None
    window, batch = entry.get("case_steps", 1), entry.get("batch_sequences")
    for name, value in (("case_steps", window), ("batch_sequences", batch)):
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"{key}.{name}: expected a positive integer, got {value!r}")
    B = spec.sequences_per_step
    if batch is not None and B % batch:
        raise ValueError(f"{key}.batch_sequences: expected a divisor of sequences_per_step ({B}), got {batch}")
    batch = batch or default_batch_sequences(B, window)
    if window * B // batch < 2:
        raise ValueError(
            f"{key}: a window of {window} step(s) of {B} sequences in batches of {batch} is a single batch, from "
            "which no gradient noise can be estimated; set case_steps: 2 or more, or a smaller batch_sequences"
        )
    plan = OrderPlan(spec, window, batch, (min(steps), max(steps)))
    available = order.length // spec.sequences_per_step
    ordered = sorted(set(steps))
    following = dict(zip(ordered, [*ordered[1:], None], strict=True))
    for case in (c for c in cases if c in ORDER_CASES):
        for step in steps:
            try:
                first, last = plan.window(case, step, following[step])
                check_window(case, (first, last), step)
            except ValueError as error:
                raise ValueError(f"{key}.cases: {error}") from None
            if last > available:
                raise ValueError(
                    f"{key}.cases: case {case} reads steps {first}..{last}, but the training order holds "
                    f"{available} steps ({order.length} sequences of {spec.sequences_per_step} per step)"
                )
            try:
                order.check_positions(order.step_sequences(first, last - first + 1))
            except ValueError as error:
                raise ValueError(f"{key}.training_order: {error}") from None
    return plan


def state_step(state: dict[str, Any]) -> int:
    """An indexed state's step: its earliest alias's."""
    return min(alias["step"] for alias in state["aliases"])


def following_state(state: dict[str, Any], states: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The state after ``state`` among ``states`` by their steps; None for the last."""
    ordered = sorted(states, key=state_step)
    after = [s["key"] for s in ordered].index(state["key"]) + 1
    return ordered[after] if after < len(ordered) else None
