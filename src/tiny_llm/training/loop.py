"""Training runs: gradient accumulation, AdamW/SGD, warmup + cosine, clipping, local SGD, resume.

Run directory layout (read by analysis):

* ``resolved.yaml``: the complete configuration.
* ``epoch-NNN.safetensors`` (``checkpoint_policy: interval``): root weights after virtual epoch
  NNN (000 = initialisation); the average of all workers for packed runs.
* ``node-NNN/epoch-NNN.safetensors``: worker NNN's weights at the same moments (packed runs).
* ``moments-NNN.safetensors`` (``training.keep_moments``, AdamW, one worker): the optimizer's moments
  by parameter name after the same step (:mod:`tiny_llm.model.moments`); none at epoch 000.
* ``final.pt``: root weights, every worker's weights and optimizer state, and the position.
* ``resume.pt``: the same content at the latest virtual-epoch boundary of an unfinished run.
* ``state-NNN.pt``: the same content at the end of virtual epoch NNN, for the epochs
  ``training.keep_states`` names (branches start from them: :mod:`tiny_llm.training.branches`).
* ``train-log.jsonl``: one line per optimizer step.

Packed runs: at local step t (0-based) worker w trains on stream batch ``t * K + w``; so stream
batch b belongs to worker ``b % K`` (``BatchPlan.worker``). After every ``sync_every`` local steps
all workers are replaced by their float32 average; optimizer states stay local. Checkpoints are
taken after that step's averaging.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tiny_llm.architectures import build_model
from tiny_llm.config import RunConfig, config_from_dict, config_to_dict, dump_config, load_config
from tiny_llm.data.tokens import TokenCache, check_capacity, stream_batches
from tiny_llm.io import atomic_write_text, exclusive, remove_leftovers
from tiny_llm.layout import FINAL, IMPORTED, RESOLVED, RESUME, TRAIN_LOG, epoch_file, moments_file, state_file
from tiny_llm.model.causal import CausalLM
from tiny_llm.model.checkpoint import load_train_state, save_train_state, save_weights
from tiny_llm.model.micro_batch import accumulate_batch_gradient  # the one micro-batch gradient
from tiny_llm.model.moments import moments_from_optimizer, save_moments
from tiny_llm.runtime import resolve_device
from tiny_llm.training.branches import load_start
from tiny_llm.training.schedule import learning_rate

__all__ = ["accumulate_batch_gradient", "average_states", "learning_rate", "run_summary", "train"]

log = logging.getLogger(__name__)

NON_SCIENTIFIC = {"training.log_every", "training.keep_states", "training.keep_moments", "data.cache"}
TRAIN_LOCK = ".train.lock"
"""Held by the trainer of a run directory (holds its process id; removed when training ends)."""
"""Settings that may change between a run and its resumption."""


def worker_dir(worker: int) -> str:
    return f"node-{worker:03d}"


def _make_optimizer(model: nn.Module, config: RunConfig) -> torch.optim.Optimizer:
    """AdamW or SGD over two groups, matrices and embeddings decayed, the rest not; each group
    carries its ``param_names``, so that a saved state places its moments by name."""
    tc = config.training
    named = list(model.named_parameters())
    groups = [
        {
            "params": [p for _, p in named if (p.dim() >= 2) == decayed],
            "param_names": [n for n, p in named if (p.dim() >= 2) == decayed],
            "weight_decay": tc.weight_decay if decayed else 0.0,
        }
        for decayed in (True, False)
    ]
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps, foreach=False)
    return torch.optim.SGD(groups, lr=tc.lr, momentum=tc.momentum, foreach=False)


def average_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of worker states (the packed run's root weights), in float32 or wider."""
    return {
        name: torch.stack([s[name].to(torch.promote_types(s[name].dtype, torch.float32)) for s in states])
        .mean(0)
        .to(states[0][name].dtype)
        for name in states[0]
    }


@dataclass
class _Worker:
    model: CausalLM
    optimizer: torch.optim.Optimizer


def _clone_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _changed_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _flat(old), _flat(new)
    return sorted(
        k for k in set(a) | set(b) if k not in NON_SCIENTIFIC and a.get(k, "<absent>") != b.get(k, "<absent>")
    )


class _Trainer:
    """One training run in one run directory; see the module docstring for the layout."""

    def __init__(self, config: RunConfig, run_dir: Path, device: str):
        self.config, self.run_dir, self.device = config, run_dir, resolve_device(device)
        self.cache = TokenCache(config.data.cache)
        self.cache.check_layout(config)
        check_capacity(self.cache, config, "train")
        self.K = config.training.workers
        self.total_steps = config.local_steps_per_epoch * config.training.epochs
        torch.manual_seed(config.training.seed)
        dtype = getattr(torch, config.training.dtype)
        init = build_model(config.model, attention_backend=config.training.attention_backend).to(self.device)
        init = init.to(dtype)  # drawn in float32 either way: float64 starts from the same weights
        self.workers = []
        for _ in range(self.K):
            model = build_model(config.model, attention_backend=config.training.attention_backend)
            model = model.to(device=self.device, dtype=dtype)
            model.load_state_dict(init.state_dict())
            self.workers.append(_Worker(model, _make_optimizer(model, config)))
        self.step = 0

    # --- state ---------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self.step * self.K * self.config.batch_tokens

    @property
    def epoch(self) -> int:
        return self.step // self.config.local_steps_per_epoch

    def position(self, complete: bool) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "epoch": self.epoch, "complete": complete}

    def root_state(self) -> dict[str, torch.Tensor]:
        states = [_clone_state(w.model) for w in self.workers]
        return states[0] if self.K == 1 else average_states(states)

    def save_state(self, name: str, complete: bool) -> None:
        save_train_state(
            self.run_dir / name,
            {
                "format": 1,
                "config": config_to_dict(self.config),
                "cache_shards": self.cache.meta["shards"],
                "position": self.position(complete),
                "model": self.root_state(),
                "workers": [
                    {"model": _clone_state(w.model), "optimizer": w.optimizer.state_dict()} for w in self.workers
                ],
            },
        )

    def restore(self, path: Path) -> None:
        state = load_train_state(path)
        saved = config_to_dict(config_from_dict(state["config"]))  # settings added since: their defaults
        changed = _changed_settings(saved, config_to_dict(self.config))
        if changed:
            raise ValueError(
                f"{path} was trained with other settings ({', '.join(changed)}); resume with the "
                "original settings or train into a new run directory"
            )
        if state["cache_shards"] != self.cache.meta["shards"]:
            raise ValueError(f"{path} was trained on a different token cache than {self.cache.path}")
        if len(state["workers"]) != self.K:
            raise ValueError(f"{path} holds {len(state['workers'])} workers, the configuration {self.K}")
        for worker, saved in zip(self.workers, state["workers"], strict=True):
            worker.model.load_state_dict(saved["model"], strict=True)
            worker.optimizer.load_state_dict(saved["optimizer"])
        self.step = int(state["position"]["step"])

    def write_epoch_checkpoint(self) -> None:
        if self.config.training.checkpoint_policy != "interval":
            return
        meta = {"format": "tiny_llm.weights/1", "step": self.step, "tokens": self.tokens, "epoch": self.epoch}
        save_weights(
            self.run_dir / epoch_file(self.epoch),
            self.root_state(),
            {**meta, "kind": "average" if self.K > 1 else "root", "workers": self.K},
        )
        self.write_moments()
        if self.K > 1:
            for w, worker in enumerate(self.workers):
                save_weights(
                    self.run_dir / worker_dir(w) / epoch_file(self.epoch),
                    _clone_state(worker.model),
                    {**meta, "kind": "worker", "worker": w},
                )

    def write_moments(self) -> None:
        """The optimizer's moments beside this epoch's checkpoint (``training.keep_moments``; AdamW
        with one worker, after its first step)."""
        tc = self.config.training
        if not tc.keep_moments or tc.optimizer != "adamw" or self.K > 1 or self.step == 0:
            return
        source = moments_file(epoch_file(self.epoch))
        save_moments(
            self.run_dir / source, moments_from_optimizer(self.workers[0].optimizer.state_dict(), None, source)
        )

    def keep_state(self) -> None:
        """The whole state at this epoch's end, when ``training.keep_states`` names the epoch."""
        if self.epoch in self.config.training.keep_states:
            self.save_state(state_file(self.epoch), complete=self.step == self.total_steps)

    # --- steps ---------------------------------------------------------------------------------
    def train_step(self, worker: _Worker, batch: int, lr: float) -> tuple[float, float]:
        tokens = self.cache.tokens(stream_batches(self.config, batch, 1)[0]).to(self.device)
        worker.optimizer.zero_grad(set_to_none=True)
        loss = accumulate_batch_gradient(worker.model, tokens, self.config.training.micro_batch_size)
        grads = [p.grad for p in worker.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if self.config.training.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(worker.model.parameters(), self.config.training.grad_clip, norm)
        for group in worker.optimizer.param_groups:
            group["lr"] = lr
        worker.optimizer.step()
        return float(loss), float(norm)

    def synchronise(self) -> None:
        average = average_states([_clone_state(w.model) for w in self.workers])
        for worker in self.workers:
            worker.model.load_state_dict(average)

    def run(self, stop_after_epoch: int | None, log_file) -> None:
        tc, spe = self.config.training, self.config.local_steps_per_epoch
        started, tokens_at_start = time.perf_counter(), self.tokens
        while self.step < self.total_steps:
            lr = learning_rate(self.step, self.total_steps, self.config)
            results = [self.train_step(w, self.step * self.K + i, lr) for i, w in enumerate(self.workers)]
            self.step += 1
            if self.K > 1 and self.step % tc.packed.sync_every == 0:
                self.synchronise()
            losses, norms = zip(*results, strict=True)
            record = {
                "step": self.step,
                "epoch": self.step / spe,
                "tokens": self.tokens,
                "lr": lr,
                "loss": sum(losses) / self.K,
                "grad_norm": max(norms),
                "grad_norm_kind": "max_worker_pre_clip" if self.K > 1 else "pre_clip",
            }
            if self.K > 1:
                record.update(worker_losses=list(losses), worker_grad_norms=list(norms))
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if self.step % tc.log_every == 0 or self.step == self.total_steps:
                rate = (self.tokens - tokens_at_start) / max(time.perf_counter() - started, 1e-9)
                log.info(
                    "epoch %d/%d step %d/%d loss %.4f grad_norm %.3f lr %.2e %.0f tok/s",
                    -(-self.step // spe),
                    tc.epochs,
                    self.step,
                    self.total_steps,
                    record["loss"],
                    record["grad_norm"],
                    lr,
                    rate,
                )
            if self.step % spe == 0:
                self.write_epoch_checkpoint()
                self.keep_state()
                if self.step < self.total_steps:
                    self.save_state(RESUME, complete=False)
                if stop_after_epoch is not None and self.epoch >= stop_after_epoch and self.step < self.total_steps:
                    log.info("stopping after epoch %d as asked; rerun the same command to resume", self.epoch)
                    return


def _check_run_dir(config: RunConfig, run_dir: Path) -> None:
    """Refuse a run directory made with a different scientific setting (writes nothing)."""
    resolved = run_dir / RESOLVED
    if resolved.exists():
        old = load_config(resolved)
        changed = _changed_settings(config_to_dict(old), config_to_dict(config))
        if changed:
            details = ", ".join(
                f"{k}: {_flat(config_to_dict(old)).get(k)!r} -> {_flat(config_to_dict(config)).get(k)!r}"
                for k in changed
            )
            raise ValueError(
                f"run directory {run_dir} was made with other settings ({details}); "
                "use a new run directory or restore the original settings"
            )


def _kept_log(path: Path, step: int) -> str | None:
    """The log lines of steps already covered by the state being resumed (None: no log yet).

    A last line cut short by a kill is dropped (its step is redone); any other unreadable line is
    refused, naming the file and line.
    """
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            entry_step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if number == len(lines):
                break
            raise ValueError(
                f"{path} line {number} is not a training log entry; restore the file or train into a new run directory"
            ) from None
        if entry_step <= step:
            kept.append(line)
    return "".join(line + "\n" for line in kept)


def train(config: RunConfig, run_dir: str | Path, *, device: str = "cpu", stop_after_epoch: int | None = None) -> Path:
    """Train (or resume, or confirm finished) the run in ``run_dir``; returns the path of final.pt.

    Rerunning with the same settings resumes from ``resume.pt`` bit-identically (CPU), or does
    nothing when ``final.pt`` exists. ``stop_after_epoch`` ends early at that virtual epoch.

    Raises:
        ValueError: a changed scientific setting, an unsuitable cache, or unreadable states.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} is a file; choose another path")
    if (run_dir / IMPORTED).exists():
        raise ValueError(
            f"{run_dir} holds imported weights (imported.json); training would overwrite them: "
            "train into a new run directory"
        )
    _check_run_dir(config, run_dir)
    trainer = _Trainer(config, run_dir, device)  # checks the cache before anything is written
    if config.training.init_from is not None and not (run_dir / RESUME).exists() and not (run_dir / FINAL).exists():
        load_start(config, trainer.workers)  # a branch: its parent's kept state, refused before any write
    run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(run_dir / TRAIN_LOCK, f"training {run_dir}"):
        return _train_locked(trainer, config, run_dir, stop_after_epoch)


def _train_locked(trainer: _Trainer, config: RunConfig, run_dir: Path, stop_after_epoch: int | None) -> Path:
    """Train while holding the run directory's lock; every state and the log are read (and
    refused when unreadable) before anything is written."""
    final, resume, log_path = run_dir / FINAL, run_dir / RESUME, run_dir / TRAIN_LOG
    for folder in [run_dir, *sorted(run_dir.glob("node-*"))]:
        for path in remove_leftovers(folder):  # temporary files of a killed write
            log.info("removed %s, left by an interrupted write", path)
    if final.exists():
        trainer.restore(final)
        if resume.exists():  # killed after final.pt was written: the run is complete
            resume.unlink()
        log.info("%s is complete (step %d); nothing to do", run_dir, trainer.step)
        return final
    if resume.exists():
        trainer.restore(resume)
        log.info("resuming %s from step %d", run_dir, trainer.step)
    kept_log = _kept_log(log_path, trainer.step)
    atomic_write_text(run_dir / RESOLVED, dump_config(config))
    if not resume.exists():
        trainer.write_epoch_checkpoint()  # epoch-000: the initialisation (a branch's: its parent's state)
        trainer.keep_state()
    if kept_log is not None:
        atomic_write_text(log_path, kept_log)
    with open(log_path, "a") as log_file:
        trainer.run(stop_after_epoch, log_file)
    if trainer.step == trainer.total_steps:
        trainer.save_state(FINAL, complete=True)
        resume.unlink(missing_ok=True)
        log.info("finished %s: %d steps, %d tokens", run_dir, trainer.step, trainer.tokens)
    return final


def run_summary(run_dir: str | Path) -> dict[str, Any]:
    """What a finished run holds: position, root checkpoints and worker folders (plain data)."""
    run_dir = Path(run_dir)
    state = load_train_state(run_dir / FINAL)
    if not state["position"].get("complete"):
        raise ValueError(f"{run_dir / 'final.pt'} is not a finished training state")
    return {
        "run": str(run_dir),
        "final": FINAL,
        "position": state["position"],
        "workers": len(state["workers"]),
        "checkpoints": sorted(p.name for p in run_dir.glob("epoch-*.safetensors")),
        "worker_dirs": sorted(p.name for p in run_dir.glob("node-*") if p.is_dir()),
    }
