"""Critical-batch-size experiments (``cbs_experiments.<name>``), planned into ordinary parts.

An experiment names a run configuration, the virtual epochs to branch from, a grid of batch sizes,
a token budget and data-order seeds. :func:`expand_cbs_experiments` turns it into what the workflow
already runs, before anything else is planned:

* the base run ``<name>-base`` (a ``train_runs`` entry) with interval checkpoints, keeping its whole
  training state at each chosen epoch (``training.keep_states``);
* one branch run ``<name>-e<NNN>-b<B>-s<seed>`` per (epoch, batch size, seed): an ordinary training
  run from that state (:func:`tiny_llm.training.branches.branch_overrides`), atomic, reused and
  resumed like any other;
* the analysis ``<name>`` of the base run at the chosen checkpoints, whose B_simple and B_noise
  stand beside the measured critical batch size.

Its own jobs are then the held-out loss of each checkpoint's branches
(``results/<name>/branches/epoch-NNN.json``) and the table and figure (``cbs.csv``,
``branches.csv``, ``figures/critical_batch``): :mod:`tiny_llm.results.cbs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tiny_llm.campaign.checks import in_folder, load_run_config
from tiny_llm.config import RunConfig, config_to_dict
from tiny_llm.data.tokens import capacity_blocks
from tiny_llm.declared import NonNegative, Positive, PositiveNumber, build
from tiny_llm.layout import epoch_file, epoch_stem
from tiny_llm.results.critical import merrill_level, seeds_needed
from tiny_llm.training.branches import (
    BRANCH_EPOCHS,
    branch_overrides,
    branch_region,
    held_out_blocks,
    memory_betas,
    state_path,
)
from tiny_llm.workers.settings import settings_from_dict

__all__ = ["CbsExperiment", "CbsPlan", "expand_cbs_experiments", "parent_receipt"]

ADAM_MEMORIES = 3
"""A branch should train at least this many × Adam's memory −1/ln β2 steps (the second moment's
e-folding time): by then 95 % of its weight lies on the branch's own gradients (e^-3)."""
CACHE_KEYS = ("config", "cache_source", "cache_inputs", "shard_tokens", "cache_order", "cache_tokenizer")
"""The keys of an experiment that its runs share (one configuration, one token cache)."""


@dataclass(frozen=True)
class CbsExperiment:
    """The keys of one ``cbs_experiments.<name>`` entry, as written (the one declaration: loaded by
    :func:`~tiny_llm.declared.build`, which refuses unknown keys and bad values by name)."""

    config: str
    """Run configuration of the base run (sections model, data, training; its ``data.cache`` is
    replaced by ``cache/<name>``: each experiment its own cache)."""
    checkpoints: tuple[NonNegative, ...]
    """Virtual epochs of the base run to branch from (0: the initialisation); each before its last
    epoch, since a branch trains on the data after it."""
    batch_sizes: tuple[Positive, ...]
    """The grid of branch batch sizes in sequences, ascending, holding the base run's B (B·2ᵏ around
    it)."""
    token_budget: Positive
    """Training tokens of every branch: a whole number of quarters of steps of every batch size (the
    loss is measured at each quarter)."""
    set: Any = None
    """Overrides of the run configuration, ``section.key: value`` (not ``training.keep_states`` or
    ``training.checkpoint_policy``: the experiment sets those)."""
    cache_source: Literal["demo", "text", "tokens"] = "demo"
    """Where the token cache comes from (as in ``train_runs``)."""
    cache_inputs: tuple[str, ...] = ()
    """Input files for cache_source text or tokens."""
    shard_tokens: Positive = 1048576
    """Approximate tokens per cache shard."""
    cache_order: Literal["shuffle", "keep"] = "shuffle"
    """``shuffle`` (preparation permutes the sequences with ``data.seed``) or ``keep`` (source
    order), as in ``train_runs``."""
    cache_tokenizer: str | None = None
    """cache_source text: a local Hugging Face tokenizer directory that encodes the text."""
    lr_rule: Literal["auto", "sqrt", "linear", "none"] = "auto"
    """A branch's learning rate: the base run's at the checkpoint × √(B'/B) (``sqrt``), × B'/B
    (``linear``) or unchanged (``none``), held constant over the branch; ``auto``: ``sqrt`` for
    ``adamw``, ``linear`` for ``sgd``."""
    data_seeds: tuple[NonNegative, ...] = (1, 2, 3)
    """Data seeds of each batch size's branches, two or more, distinct; each seed reads its own
    sequences, the same at every batch size and rate, so the paired differences between batch sizes
    have a confidence interval."""
    epsilon: PositiveNumber = 0.01
    """Merrill et al.'s tolerance in nats: a batch is within it when its held-out loss exceeds every
    smaller batch's (from the base batch up) by at most ε, by the confidence interval's upper bound."""
    lr_factors: tuple[PositiveNumber, ...] = (1.0,)
    """The learning-rate grid: multiples of the rule's rate that every checkpoint, batch size and
    seed trains with, holding 1 (the rule's own rate); ``[1]`` alone, or three or more (for instance
    ``[0.5, 1, 2]``) to tune each batch's rate (``rates.csv``; every answer then at each batch's best
    rate and at the rule's)."""
    optimizer_memory: Literal["steps", "tokens"] = "steps"
    """Adam's β1 and β2 at each batch: the base run's (``steps``: the moments remember as many
    steps at every batch), or raised to the power B'/B (``tokens``: as many training tokens)."""
    paired_spread: PositiveNumber = 0.005
    """The assumed standard deviation over seeds of a paired difference of held-out losses (nats),
    from which the plan says how many seeds ε needs (a finished experiment's ``cbs.csv`` gives the
    measured one)."""
    eval_sequences: Positive = 64
    """Held-out sequences (the base run's unseen stream; at most one unseen epoch of it) every
    branch's loss is measured on."""
    case: Literal["seen", "unseen"] = "unseen"
    """The case of the analysis whose B_simple and B_noise stand beside the critical batch size
    (``unseen``: fresh data, as the branches train on; or ``seen``)."""
    settings: Any = None
    """Settings of that analysis, as an analysis's ``settings``."""

    def shared(self) -> dict[str, Any]:
        """What every run of the experiment takes from it (a train_runs entry's cache keys)."""
        keys = {k: getattr(self, k) for k in CACHE_KEYS if getattr(self, k) is not None}
        return {**keys, "cache_inputs": list(self.cache_inputs)}


@dataclass(frozen=True)
class CbsPlan:
    """One critical-batch-size experiment as planned."""

    name: str
    base: str
    """Its base run (runs/<base>)."""
    base_config: RunConfig
    epochs: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    token_budget: int
    epsilon: float
    base_batch: int
    """The base run's batch size: Merrill's rule compares the batches k × it, k ≥ 1."""
    memory: dict[int, tuple[float, float]] | None
    """Each batch's Adam memory −1 / ln β2 in steps and in tokens (None for SGD)."""
    factors: tuple[float, ...]
    """The learning-rate grid (multiples of the rule's rate)."""
    paired_spread: float
    """The assumed standard deviation of a paired difference, for the seeds ε needs."""
    case: str
    """The analysis case whose B_simple and B_noise stand beside the critical batch size."""
    eval_blocks: tuple[int, ...]
    """The held-out cache blocks every branch's loss is measured on."""
    branches: dict[int, dict[str, dict[str, Any]]]
    """Per epoch: each branch run's name → its batch size, seed, steps and learning rate."""

    def branch_minutes(self, base_minutes: int) -> int:
        """The walltime a branch asks for when its base run asks for ``base_minutes``: the base's
        scaled by the branch's share of its tokens, plus 30 minutes, rounded up to the hour (at most
        the base's)."""
        share = self.token_budget / self.base_config.training.tokens
        return min(base_minutes, 60 * math.ceil((share * base_minutes + 30) / 60))

    def epoch_of(self, checkpoint: str) -> int:
        return int(checkpoint.removeprefix("epoch-"))

    def records(self) -> list[str]:
        """The held-out losses of each checkpoint's branches."""
        return [f"results/{self.name}/branches/{epoch_stem(epoch)}.json" for epoch in self.epochs]

    def position(self, epoch: int) -> dict[str, int]:
        """The base run's step and training tokens at the end of virtual epoch ``epoch``."""
        step = epoch * self.base_config.local_steps_per_epoch
        return {"step": step, "tokens": step * self.base_config.batch_tokens}

    def evaluation(self, checkpoint: str, device: str) -> dict[str, Any]:
        """What the held-out measurement of one checkpoint's branches is given (plain data)."""
        epoch = self.epoch_of(checkpoint)
        return {
            "checkpoint": checkpoint,
            **self.position(epoch),
            "state": state_path(f"runs/{self.base}", epoch),
            "token_budget": self.token_budget,
            "base": config_to_dict(self.base_config),
            "blocks": list(self.eval_blocks),
            "device": device,
            "branches": self.branches[epoch],
        }

    def receipts(self, checkpoint: str) -> list[str]:
        """The training receipts of one checkpoint's branch runs."""
        return [f"runs/{run}/trained.json" for run in self.branches[self.epoch_of(checkpoint)]]

    def targets(self) -> list[str]:
        figures = [f"results/{self.name}/figures/critical_batch.{ext}" for ext in ("pdf", "png")]
        tables = [f"results/{self.name}/{table}.csv" for table in ("cbs", "branches", "rates", "fits", "curves")]
        return [*tables, *figures]

    def cost_lines(self) -> list[str]:
        """What the experiment adds to its base run and analysis (the branch runs and their tokens,
        each batch's optimizer memory, the seeds ε needs), then a warning when its largest batch's
        branches are too short to leave Adam's memory."""
        runs = sum(len(b) for b in self.branches.values())
        base, T = self.base_config.training.tokens, self.base_config.data.seq_len
        checkpoints = _count(len(self.epochs), "checkpoint")
        steps = [self.token_budget // (b * T) for b in self.batch_sizes]
        rates = "" if self.factors == (1.0,) else f" × {len(self.factors)} learning rates ({_factors(self.factors)})"
        lines = [
            f"cbs experiment {self.name}: {checkpoints} × {len(self.batch_sizes)} batch sizes "
            f"({', '.join(map(str, self.batch_sizes))} sequences){rates} × {len(self.seeds)} data seeds = {runs} "
            f"branch runs of {self.token_budget:,} tokens ({runs * self.token_budget:,} tokens in all, "
            f"{runs * self.token_budget / base:.3g} × the base run's {base:,}), {steps[0]} to {steps[-1]} steps, "
            f"each measured on {len(self.eval_blocks)} held-out sequences at every quarter of its budget; "
            f"B_simple and B_noise from analysis {self.name}, case {self.case}"
        ]
        if self.memory is not None:
            memory = ", ".join(f"{b}: {s:.3g} steps = {t:,.0f} tokens" for b, (s, t) in self.memory.items())
            lines.append(f"cbs experiment {self.name}: Adam's memory −1/ln β2 by batch: {memory}")
        grid = len([b for b in self.batch_sizes if b >= self.base_batch])
        needed = seeds_needed(self.paired_spread, self.epsilon, grid)
        comparisons, level = merrill_level(grid)
        lines.append(
            f"cbs experiment {self.name}: Merrill's rule makes {_count(comparisons, 'paired comparison')}, "
            "each bound at "
            f"{100 * level:.3g} % one-sided (95 % jointly); at a paired spread of {self.paired_spread:g} nats "
            f"(cbs_experiments.{self.name}.paired_spread) ε = {self.epsilon:g} needs "
            + (f"{needed} data seeds" if needed else "more than 1,000 data seeds")
            + f", the experiment has {len(self.seeds)}"
        )
        if self.memory is not None and steps[-1] < ADAM_MEMORIES * self.memory[self.batch_sizes[-1]][0]:
            lines.append(self._short_warning(steps[-1], self.memory[self.batch_sizes[-1]][0]))
        return lines

    def _short_warning(self, steps: int, memory: float) -> str:
        T = self.base_config.data.seq_len
        unit = budget_unit(self.batch_sizes, T)
        enough = math.ceil(ADAM_MEMORIES * memory) * self.batch_sizes[-1] * T
        return (
            f"warning: cbs_experiments.{self.name}.token_budget: the largest batch's branches train "
            f"{steps} steps, fewer than {ADAM_MEMORIES} × Adam's memory ({memory:.3g} steps): "
            "their optimizer moments still carry the base batch's gradients at the end; raise token_budget "
            f"to {-(-enough // unit) * unit:,} or more"
        )


def _factors(factors: tuple[float, ...]) -> str:
    return ", ".join(f"{f:g}" for f in factors) + " × the rule's"


def branch_plans(experiments: dict[str, CbsPlan]) -> dict[str, CbsPlan]:
    """Every branch run of the critical-batch-size ``experiments`` → its experiment's plan."""
    return {run: plan for plan in experiments.values() for runs in plan.branches.values() for run in runs}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def budget_unit(batch_sizes: tuple[int, ...], seq_len: int) -> int:
    """The tokens a branch budget is a multiple of: a whole quarter of steps (the loss is measured at
    each) of every batch size."""
    return BRANCH_EPOCHS * math.lcm(*batch_sizes) * seq_len


def _check_grid(key: str, entry: CbsExperiment, base: RunConfig) -> None:
    """The epochs, batch sizes and budget: every branch trains whole steps on its parent's
    training data only (never on the held-out sequences).

    Raises:
        ValueError: naming the key.
    """
    epochs, sizes, budget, T = entry.checkpoints, entry.batch_sizes, entry.token_budget, base.data.seq_len
    if base.training.packed is not None:
        raise ValueError(f"{key}.config: a packed run (training.packed); branches start from ordinary runs")
    if sorted(set(sizes)) != list(sizes) or len(sizes) < 2:
        raise ValueError(f"{key}.batch_sizes: list two or more, ascending, got {list(sizes)}")
    if len(entry.data_seeds) < 2 or len(set(entry.data_seeds)) != len(entry.data_seeds):
        raise ValueError(
            f"{key}.data_seeds: list two or more distinct data orders (every answer's interval comes from "
            f"the seeds' paired differences), got {list(entry.data_seeds)}"
        )
    if not epochs:
        raise ValueError(f"{key}.checkpoints: list one or more epochs to branch from")
    _check_rates(key, entry, base)
    for epoch in epochs:
        if not 0 <= epoch < base.training.epochs:
            raise ValueError(
                f"{key}.checkpoints: epoch {epoch} is not one to branch from; the run's virtual epochs are "
                f"0 (initialisation) to {base.training.epochs}, and a branch needs training data after its epoch"
            )
    step = budget_unit(sizes, T)
    if budget % step:
        raise ValueError(
            f"{key}.token_budget: {budget} is not a whole number of quarters of steps for every batch size "
            f"(the loss is measured at each quarter); use a multiple of {step} ({BRANCH_EPOCHS} × the batch "
            f"sizes' least common multiple × data.seq_len {T})"
        )
    if base.training.batch_size not in sizes:
        raise ValueError(
            f"{key}.batch_sizes: {list(sizes)} leaves out the base run's batch {base.training.batch_size}; "
            "Merrill's rule compares the batches k × it (k ≥ 1) with it"
        )
    room = capacity_blocks(base)["train"]
    need = branch_region(base, max(epochs), budget, len(entry.data_seeds))
    if need > room:
        raise ValueError(
            f"{key}.token_budget: {len(entry.data_seeds)} data seeds of {budget} tokens each from epoch "
            f"{max(epochs)} would read to sequence {need} of the training stream, which holds {room} before "
            "the held-out data (each seed reads its own whole shuffle groups after the branch point); lower "
            "token_budget, use fewer data_seeds, branch from earlier checkpoints, or train the base run on "
            "more tokens"
        )


def _check_rates(key: str, entry: CbsExperiment, base: RunConfig) -> None:
    """The learning-rate grid holds the rule's own rate, and tunes (three or more) or not (1 alone);
    the optimizer's memory in tokens is Adam's; the base run keeps the states branches start from.

    Raises:
        ValueError: naming the key.
    """
    factors = entry.lr_factors
    if 1 not in factors or len(set(factors)) != len(factors) or len(factors) == 2:
        raise ValueError(
            f"{key}.lr_factors: list the multiples of the rule's rate to train with, distinct, holding 1 (the "
            f"rule's own rate): [1] alone, or three or more to tune each batch's rate (e.g. [0.5, 1, 2]); "
            f"got {list(factors)}"
        )
    if entry.optimizer_memory == "tokens" and base.training.optimizer != "adamw":
        raise ValueError(
            f"{key}.optimizer_memory: tokens scales Adam's β1 and β2 with the batch; the base run trains with "
            f"{base.training.optimizer} (training.optimizer), so use steps"
        )
    for name in ("training.keep_states", "training.checkpoint_policy"):
        if name in (entry.set or {}):
            raise ValueError(
                f"{key}.set: {name} is the experiment's to set (the base run keeps its whole state at every "
                "checkpoint of cbs_experiments.<name>.checkpoints); leave it out and list the epochs in checkpoints"
            )


def _branches(name: str, entry: CbsExperiment, base: RunConfig, kept: dict[str, Any]) -> tuple[dict, dict]:
    """Every branch run's train_runs entry, and per epoch what each branch is (for the records):
    one per (batch size, data seed, ``lr_factors`` entry: the rule's rate × that factor)."""
    runs, branches = {}, {}
    grid = [(b, s, float(f)) for b in entry.batch_sizes for s in entry.data_seeds for f in sorted(entry.lr_factors)]
    for epoch in sorted(set(entry.checkpoints)):
        branches[epoch] = {}
        for size, seed, factor in grid:
            run = f"{name}-e{epoch:03d}-b{size}-s{seed}" + ("" if factor == 1 else f"-lr{factor:g}")
            state = state_path(f"runs/{name}-base", epoch)
            data = (seed, entry.data_seeds.index(seed))
            overrides = branch_overrides(base, state, epoch, size, entry.token_budget, data, entry.lr_rule)
            overrides["training.lr"] *= factor
            if base.training.optimizer == "adamw":
                overrides |= memory_betas(base, size, entry.optimizer_memory)
            runs[run] = {**entry.shared(), "set": {**kept, **overrides}, "parent": f"{name}-base"}
            branches[epoch][run] = {
                "batch_size": size,
                "seed": seed,
                "steps": entry.token_budget // (size * base.data.seq_len),
                "lr": overrides["training.lr"],
                "lr_factor": factor,
                "beta1": overrides.get("training.beta1"),
                "beta2": overrides.get("training.beta2"),
                "points": overrides["training.epochs"],  # epoch-001 … of its loss curve
            }
    return runs, branches


def _plan(name: str, data: dict[str, Any]) -> tuple[CbsPlan, dict[str, dict[str, Any]], dict[str, Any]]:
    """One experiment: its plan, its runs (name → train_runs entry) and its analysis entry."""
    key = f"cbs_experiments.{name}"
    try:
        entry = build(CbsExperiment, data or {}, f"{key}.")
    except TypeError:  # a required key missing
        missing = [k for k in ("config", "checkpoints", "batch_sizes", "token_budget") if k not in (data or {})]
        raise ValueError(f"{key}: give {', '.join(missing)} (see docs/critical-batch.md)") from None
    epochs = tuple(sorted(set(entry.checkpoints)))
    kept = {"data.cache": f"cache/{name}", **(entry.set or {})}  # each experiment its own cache
    kept |= {"training.checkpoint_policy": "interval", "training.keep_states": list(epochs)}
    try:
        base = load_run_config({**entry.shared(), "set": kept})
        settings_from_dict(entry.settings or {})
    except ValueError as error:
        raise ValueError(f"{key}: {error}") from None
    need = "data.cache must be cache/<name> for the workflow to prepare the base run's cache"
    in_folder(Path(base.data.cache), "cache", f"{key}.set", need, f"; leave it out (cache/{name}) or name one")
    _check_grid(key, entry, base)
    try:
        blocks = tuple(held_out_blocks(base, entry.eval_sequences))
    except ValueError as error:
        raise ValueError(f"{key}.{error}") from None
    runs, branches = _branches(name, entry, base, kept)
    analysis = {
        "run": f"runs/{name}-base",
        "checkpoints": [epoch_file(e) for e in epochs],
        "cases": [entry.case],
        "settings": entry.settings or {},
    }
    plan = CbsPlan(
        name=name,
        base=f"{name}-base",
        base_config=base,
        epochs=epochs,
        batch_sizes=entry.batch_sizes,
        seeds=entry.data_seeds,
        token_budget=entry.token_budget,
        epsilon=entry.epsilon,
        base_batch=base.training.batch_size,
        memory=_memory(entry, base),
        factors=tuple(sorted(float(f) for f in entry.lr_factors)),
        paired_spread=entry.paired_spread,
        case=entry.case,
        eval_blocks=blocks,
        branches=branches,
    )
    return plan, {f"{name}-base": {**entry.shared(), "set": kept}, **runs}, analysis


def _memory(entry: CbsExperiment, base: RunConfig) -> dict[int, tuple[float, float]] | None:
    """Each batch's Adam memory −1 / ln β2 (its second moment's e-folding time): in steps and in
    training tokens (None for SGD)."""
    if base.training.optimizer != "adamw":
        return None
    memory = {}
    for batch in entry.batch_sizes:
        steps = -1 / math.log(memory_betas(base, batch, entry.optimizer_memory)["training.beta2"])
        memory[batch] = (steps, steps * batch * base.data.seq_len)
    return memory


def expand_cbs_experiments(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, CbsPlan]]:
    """The workflow configuration with every experiment's runs added to ``train_runs`` and its
    analysis to ``analyses``, and the experiments' plans.

    Raises:
        ValueError: a name taken twice or an experiment that cannot run, naming the key.
    """
    experiments = config.get("cbs_experiments") or {}
    if not experiments:
        return config, {}
    train_runs, analyses = dict(config.get("train_runs") or {}), dict(config.get("analyses") or {})
    taken = {
        **dict.fromkeys(config.get("seed_experiments") or {}, "seed_experiments"),
        **dict.fromkeys(analyses, "analyses"),
    }
    plans = {}
    for name, entry in experiments.items():
        if name in taken:
            raise ValueError(
                f"cbs_experiments.{name}: {taken[name]}.{name} has the same name (both write "
                f"results/{name}/); rename one"
            )
        plan, runs, analysis = _plan(name, entry)
        for run in runs:
            if run in train_runs:
                raise ValueError(f"cbs_experiments.{name} trains runs/{run}, which train_runs also names; rename one")
        train_runs.update(runs)
        analyses[name] = analysis
        plans[name] = plan
    return {**config, "train_runs": train_runs, "analyses": analyses}, plans


def parent_receipt(train_runs: dict[str, Any], run: str) -> list[str]:
    """What training ``run`` waits for besides its cache: its parent's receipt, for a branch."""
    parent = train_runs.get(run, {}).get("parent")
    return [str(Path("runs") / parent / "trained.json")] if parent else []
