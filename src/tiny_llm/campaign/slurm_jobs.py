"""Slurm jobs that an earlier controller submitted for this project directory, and waiting for them.

Submitted Slurm jobs outlive the Snakemake process that submitted them: a lost login session or a
killed controller leaves them queued or running, and so does Ctrl-C (see
:func:`tiny_llm.campaign.slurm_states.keep_running_jobs_on_interrupt`). When the same command starts
again, the workflow re-attaches to them instead of paying for their work twice:

- :func:`earlier_jobs` lists this user's active jobs whose working directory is this project and
  whose batch script runs Snakemake's ``--target-jobs``: for each, which rule instances
  (rule and wildcards) it computes. Read-only, so dry runs show the plan too.
- A job still queued has done nothing: the workflow cancels it (:func:`cancel`) and submits its
  work again under the new controller.
- A job already running is awaited: its results are the outputs of a local job that waits for it
  (:func:`wait_for_job`), so nothing is computed twice and the rest of the campaign goes on.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm.campaign.jobs import remember_signature
from tiny_llm.layout import SPECTRUM_RESULT, STATE_DONE, STATE_RESULT

__all__ = [
    "AWAITABLE",
    "STANDS_IN",
    "EarlierJob",
    "Reattachment",
    "awaited_outputs",
    "cancel",
    "earlier_jobs",
    "job_state",
    "parse_target_jobs",
    "reattach",
    "sort_earlier_jobs",
    "wait_for_job",
]

QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
"""States of a job that has not started: cancelling it loses nothing."""
ACTIVE = QUEUED | {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
"""States of a job that may still write results."""

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class EarlierJob:
    """An active Slurm job running Snakemake rule instances in this project directory."""

    job_id: str
    state: str
    targets: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """(rule, ((wildcard, value), ...)) for each rule instance the job computes."""

    @property
    def queued(self) -> bool:
        return self.state in QUEUED


def parse_target_jobs(script: str) -> list[tuple[str, dict[str, str]]]:
    """The rule instances named by ``--target-jobs`` in a Snakemake job's batch script.

    >>> parse_target_jobs("python -m snakemake --target-jobs 'a:x=1,y=2' 'b:x=1' --cores 1")
    [('a', {'x': '1', 'y': '2'}), ('b', {'x': '1'})]
    """
    tokens = shlex.split(script, comments=True)
    if "--target-jobs" not in tokens:
        return []
    targets = []
    for token in tokens[tokens.index("--target-jobs") + 1 :]:
        if token.startswith("--"):
            break
        rule, _, wildcards = token.partition(":")
        targets.append((rule, dict(item.split("=", 1) for item in wildcards.split(",") if "=" in item)))
    return targets


def _run(command: list[str], runner: Runner) -> subprocess.CompletedProcess:
    return runner(command, capture_output=True, text=True, timeout=60)


def earlier_jobs(workdir: str | Path, runner: Runner = subprocess.run) -> tuple[list[EarlierJob], list[str]]:
    """This user's active Slurm jobs that run Snakemake rule instances in ``workdir``.

    Returns the jobs, in submission order, and warnings (a job whose batch script could not be read). Without Slurm's
    commands, or when ``squeue`` fails, there are none (and a warning for the failure).
    """
    if not shutil.which("squeue") and runner is subprocess.run:
        return [], []
    workdir = Path(workdir).resolve()
    queue = _run(["squeue", "--me", "-h", "-o", "%i|%T|%Z"], runner)
    if queue.returncode != 0:
        return [], [
            f"squeue failed ({queue.stderr.strip()[:200]}); jobs of an earlier controller, if any, are not re-attached"
        ]
    jobs, warnings = [], []
    for line in queue.stdout.splitlines():
        job_id, state, directory = (line.split("|", 2) + ["", ""])[:3]
        if state not in ACTIVE or not directory or Path(directory).resolve() != workdir:
            continue
        script = _run(["scontrol", "write", "batch_script", job_id, "-"], runner)
        if script.returncode != 0:
            warnings.append(
                f"Slurm job {job_id} ({state}) runs in this directory, but its batch script "
                f"cannot be read ({script.stderr.strip()[:200]}): if it computes results of "
                "this workflow they may be computed twice"
            )
            continue
        targets = parse_target_jobs(script.stdout)
        if targets:
            jobs.append(EarlierJob(job_id, state, tuple((rule, tuple(sorted(wc.items()))) for rule, wc in targets)))
    return sorted(jobs, key=lambda job: (len(job.job_id), job.job_id)), warnings


def cancel(job_ids: list[str], runner: Runner = subprocess.run) -> None:
    """scancel the jobs; raises RuntimeError with scancel's message when it fails."""
    if job_ids:
        done = _run(["scancel", *job_ids], runner)
        if done.returncode != 0:
            raise RuntimeError(f"scancel {' '.join(job_ids)} failed: {done.stderr.strip()}")


def job_state(job_id: str, runner: Runner = subprocess.run) -> str | None:
    """The job's state while Slurm's queue holds it (PENDING, RUNNING, ...), else None."""
    queue = _run(["squeue", "-h", "-j", job_id, "-o", "%T"], runner)
    state = queue.stdout.strip() if queue.returncode == 0 else ""
    return state.split()[0] if state else None


def _final_state(job_id: str, runner: Runner) -> str:
    done = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], runner)
    state = done.stdout.strip().splitlines()[0].split()[0] if done.returncode == 0 and done.stdout.strip() else ""
    return state or "unknown (no accounting)"


def wait_for_job(
    job_id: str,
    outputs: list[str],
    *,
    poll_seconds: float = 30,
    latency_seconds: float = 60,
    log: Callable[[str], None] = print,
    runner: Runner = subprocess.run,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until Slurm job ``job_id`` leaves the queue, then until ``outputs`` exist.

    Raises:
        RuntimeError: the job ended without writing every output (it failed, timed out or was
            cancelled); the message names the job, its final state and what to do.
    """
    started = time.monotonic()
    last = None
    while (state := job_state(job_id, runner)) is not None:
        if state != last:
            log(f"Slurm job {job_id}: {state}")
            last = state
        sleep(poll_seconds)
    elapsed = time.monotonic() - started
    log(f"Slurm job {job_id} left the queue after {elapsed:.0f} s of waiting")
    deadline = time.monotonic() + latency_seconds
    while missing := [path for path in outputs if not Path(path).exists()]:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"Slurm job {job_id}, submitted by an earlier controller, ended "
                f"({_final_state(job_id, runner)}) without writing {', '.join(missing)}; run the same "
                "command again to compute it (the job's log is under logs/slurm/)"
            )
        sleep(min(poll_seconds, 1.0))
    log(f"Slurm job {job_id} wrote {', '.join(outputs)}")


AWAITABLE = {
    "analyze_state": STATE_RESULT,
    "finish_state": STATE_DONE,
    "analyze_spectrum": SPECTRUM_RESULT,
}
"""Outputs of the rules that a local job can stand in for while an earlier controller's job computes them."""


STANDS_IN = {"await_result": "analyze_state", "await_receipt": "finish_state", "await_spectrum": "analyze_spectrum"}
"""The local rule that awaits an earlier job -> the rule it stands in for."""


def awaited_outputs(jobs: list[EarlierJob], analyses: Iterable[str]) -> dict[str, str]:
    """Output -> id of the running Slurm job of an earlier controller that writes it (only jobs
    whose every target is an awaitable result of a configured analysis)."""
    analyses, awaited = set(analyses), {}
    for job in jobs:
        targets = [(name, dict(wildcards)) for name, wildcards in job.targets]
        if not job.queued and all(
            name in AWAITABLE and wildcards.get("analysis") in analyses for name, wildcards in targets
        ):
            for name, wildcards in targets:
                awaited[AWAITABLE[name].format(**wildcards)] = job.job_id
    return awaited


def sort_earlier_jobs(
    jobs: list[EarlierJob], needed: set[tuple[str, tuple[tuple[str, str], ...]]], awaited: dict[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """The earlier controllers' jobs that compute something this run needs, by what to do:
    (queued jobs to cancel, running jobs awaited by a local job, running jobs to wait for first).

    ``needed`` holds (rule, sorted wildcard items) of every job this run must run, with the await
    rules named as the rules they stand in for. Jobs of other controllers' work are left alone.
    """
    queued, waited, first = [], [], []
    for job in jobs:
        if not any(target in needed for target in job.targets):
            continue
        if job.queued:
            queued.append(job.job_id)
        elif job.job_id in awaited.values():
            waited.append(job.job_id)
        else:
            first.append(job.job_id)
    return queued, waited, first


def reattach(
    jobs: list[EarlierJob],
    needed: set[tuple[str, tuple[tuple[str, str], ...]]],
    awaited: dict[str, str],
    poll_seconds: float,
    runner: Runner = subprocess.run,
) -> None:
    """At the start of a run: cancel the earlier controllers' queued jobs that compute what this run
    needs (their work is submitted again now), report the running ones that are awaited, and wait
    for running jobs of other rules (training, data, calibration), whose work a new job would
    otherwise repeat (see :func:`sort_earlier_jobs` for ``needed`` and ``awaited``)."""
    queued, waited, first = sort_earlier_jobs(jobs, needed, awaited)
    if queued:
        cancel(queued, runner)
        print(
            f"Cancelled {len(queued)} queued Slurm job(s) of an earlier controller ({' '.join(queued)}); "
            "their work is submitted again by this run.",
            file=sys.stderr,
        )
    if waited:
        print(
            f"Re-attached to {len(waited)} running Slurm job(s) of an earlier controller ({' '.join(waited)}): "
            "their results are awaited (rules await_*), not computed again.",
            file=sys.stderr,
        )
    for job_id in first:
        print(
            f"Waiting for Slurm job {job_id} of an earlier controller (training, data or calibration) before "
            "submitting anything that would repeat its work...",
            file=sys.stderr,
        )
        wait_for_job(
            job_id, [], poll_seconds=poll_seconds, log=lambda line: print(line, file=sys.stderr), runner=runner
        )


NOT_AWAITED = ".snakemake/tiny-llm/no earlier Slurm job writes this"
"""The input of a stand-in rule whose output no earlier job writes: a file no rule makes, so that
the ordinary rule applies."""


class Reattachment:
    """The workflow's view of earlier controllers' Slurm jobs: looked up once, while the DAG is
    built, and only by a controller that submits to Slurm (not a dry run, not a local run); the
    input functions of the ``await_*`` rules; and the settling at the start of a run."""

    def __init__(self, workflow: Any, analyses: Iterable[str], runner: Runner = subprocess.run) -> None:
        self.workflow, self.analyses, self.runner = workflow, list(analyses), runner

    @functools.cached_property
    def jobs(self) -> list[EarlierJob]:
        w = self.workflow
        if not w.is_main_process or w.local_exec or w.dryrun:
            return []
        found, warnings = earlier_jobs(Path.cwd(), self.runner)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return found

    @functools.cached_property
    def awaited(self) -> dict[str, str]:
        return awaited_outputs(self.jobs, self.analyses)

    @staticmethod
    def _output(wildcards: Any, stage: str, name: str | None) -> str:
        return f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{name or wildcards.case}.json"

    def when_awaited(self, stage: str, function: Callable, name: str | None = None) -> Callable:
        """A stand-in rule's input function: ``function``'s input when an earlier job writes this
        output, else :data:`NOT_AWAITED`."""

        def get_awaited_input(wildcards: Any) -> Any:
            return function(wildcards) if self._output(wildcards, stage, name) in self.awaited else NOT_AWAITED

        return remember_signature(get_awaited_input)

    def earlier_job(self, stage: str, name: str | None = None) -> Callable:
        """A stand-in rule's resource: the id of the earlier job that writes its output ("" if none)."""

        def get_earlier_job(wildcards: Any) -> str:
            return self.awaited.get(self._output(wildcards, stage, name), "")

        return remember_signature(get_earlier_job)

    def reattach(self, dag: Any, poll_seconds: float) -> None:
        """At the start of a run: settle the earlier controllers' jobs that this run needs
        (:func:`reattach`), the await rules named as the rules they stand in for."""
        needed = {
            (STANDS_IN.get(job.rule.name, job.rule.name), tuple(sorted(job.wildcards_dict.items())))
            for job in dag.needrun_jobs()
        }
        reattach(self.jobs, needed, self.awaited, poll_seconds, self.runner)
