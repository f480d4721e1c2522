"""Run one (state, case) job on several ranks: ``run_on_ranks`` starts ``torchrun`` with N processes
(one per GPU; CPU processes with gloo on a machine without one), each of which joins the process
group and makes the same worker call; rank 0 writes the result, and the caller reads it back.

On one node torchrun's standalone rendezvous is used. A Slurm job over several nodes starts one
torchrun per node with ``srun``, all meeting at the first node of the allocation (c10d rendezvous,
keyed by the Slurm job id). Each rank gets ``threads`` CPU threads.

``python -m tiny_llm.workers.ranks SPEC`` is what every rank runs: SPEC is a JSON file naming the
worker and its arguments.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["allocation_nodes", "launch_command", "run_on_ranks"]

PORT = 29_431
"""The rendezvous port on the first node of a multi-node job."""


STEP_VARIABLES = (
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)
"""A job step's description of itself, which a step started from inside it must not inherit."""


def allocation_nodes() -> list[str]:
    """The nodes of this Slurm job's allocation, first node first, from the controller (inside a
    job step the environment names the step's nodes, not the job's)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True, check=True
    ).stdout
    nodelist = re.search(r"(?:^|\s)NodeList=(\S+)", shown)
    if nodelist is None:
        raise RuntimeError(f"scontrol show job {os.environ['SLURM_JOB_ID']} names no NodeList: {shown.strip()}")
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist.group(1)], capture_output=True, text=True, check=True
    ).stdout.split()


def launch_command(spec: Path, ranks: int, nodes: int = 1) -> list[str]:
    """The command that runs ``spec`` on ``ranks`` processes per node over ``nodes`` nodes."""
    module = [sys.executable, "-m", "torch.distributed.run"]
    worker = ["-m", "tiny_llm.workers.ranks", str(spec)]
    if nodes == 1:
        return [*module, "--standalone", "--nproc-per-node", str(ranks), *worker]
    head = allocation_nodes()[0]
    # Run from inside Snakemake's job step, whose environment describes that step (one task on the
    # first node: SLURM_NTASKS=1, SLURM_NNODES=1, SLURM_JOB_NODELIST=that node), not the job: srun
    # would take those and run one torchrun, whose rendezvous then waits for the others for ever.
    # Without them srun asks the controller for the job's allocation. --overlap: the job's own step
    # holds its CPUs and GPUs meanwhile. --kill-on-bad-exit: a node whose ranks fail (killed, out of
    # memory) ends the others', which would otherwise wait in a collective until the walltime.
    return [
        "env",
        *(f"--unset={name}" for name in STEP_VARIABLES),
        "srun",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes),
        "--ntasks-per-node",
        "1",
        *module,
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(ranks),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{head}:{PORT}",
        "--rdzv-id",
        os.environ.get("SLURM_JOB_ID", "tiny-llm"),
        *worker,
    ]


def run_on_ranks(
    worker: str, arguments: dict[str, Any], output: str | Path, *, ranks: int, nodes: int = 1, threads: int = 1
) -> dict[str, Any]:
    """``worker`` (``analyze_state`` or ``analyze_spectrum``) with ``arguments`` on ``ranks`` processes
    per node; returns the result rank 0 wrote to ``output``. One rank in all: a plain call here.

    Raises:
        ValueError: a rank refused its inputs (the message of rank 0's error).
        RuntimeError: the ranks failed otherwise (their output is in this job's log).
    """
    output = Path(output)
    if ranks * nodes == 1:
        from tiny_llm.runtime import keep_freed_memory

        keep_freed_memory()  # as each rank does (``main``)
        return _worker(worker)(**arguments, output=output)
    spec = output.with_name(f".{output.name}.ranks.json")
    error = spec.with_suffix(".error")
    spec.write_text(json.dumps({"worker": worker, "arguments": arguments, "output": str(output), "error": str(error)}))
    error.unlink(missing_ok=True)
    try:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        sys.stderr.flush()
        done = _launch(launch_command(spec, ranks, nodes), env)
        if error.exists():  # the rank's own line, after the launcher's report: the last line of the log
            raise ValueError(error.read_text().strip())
        if done.returncode != 0:
            raise RuntimeError(
                f"{ranks * nodes} ranks of {worker} failed (exit status {done.returncode}); their "
                "output is above in this log"
            )
        return json.loads(output.read_text())
    finally:
        spec.unlink(missing_ok=True)
        error.unlink(missing_ok=True)


def _launch(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the launcher, its output into this job's log. Stopping this job stops the ranks: SIGTERM,
    SIGINT and SIGHUP are passed on to the launcher, which stops its ranks, and the launcher (like
    each rank) gets SIGTERM from the kernel if this process dies."""
    import signal

    from tiny_llm.runtime import die_with_parent

    process = subprocess.Popen(
        command,
        stdout=sys.stderr,
        stderr=sys.stderr,
        env=env,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )
    forward = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    received: list[int] = []

    def pass_on(number: int, _frame) -> None:
        received.append(number)
        process.send_signal(number)

    previous = {sig: signal.signal(sig, pass_on) for sig in forward}
    try:
        process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process.poll() is None:
            process.terminate()
            process.wait()
    # Stopped: this job was (the signal passed on), or the launcher itself was killed. A launcher
    # that reports its ranks' signal (srun: 128 + the signal of a rank killed on another node) is
    # a failure of the ranks, which the caller reports as such.
    if received or process.returncode in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP, -signal.SIGKILL):
        raise KeyboardInterrupt(f"stopped (the launcher ended with status {process.returncode})")
    return subprocess.CompletedProcess(command, process.returncode)


def _worker(name: str):
    if name == "analyze_state":
        from tiny_llm.workers.state import analyze_state

        return lambda settings, **kw: analyze_state(settings=_settings(settings), **kw)
    if name == "analyze_spectrum":
        from tiny_llm.workers.spectrum import analyze_spectrum, spectrum_settings_from_dict

        return lambda settings, spectrum, **kw: analyze_spectrum(
            settings=_settings(settings), spectrum=spectrum_settings_from_dict(spectrum), **kw
        )
    raise ValueError(f"unknown worker {name!r}")


def _settings(data: dict[str, Any]):
    from tiny_llm.workers.settings import settings_from_dict

    return settings_from_dict(data)


def main(spec_path: str) -> None:
    """One rank: join the group torchrun describes, make the call; rank 0 records a refusal."""
    import logging

    import torch

    from tiny_llm.distributed import OneWriter, init_from_environment, leave
    from tiny_llm.runtime import die_with_parent, keep_freed_memory

    die_with_parent()  # the launcher killed: this rank stops too
    keep_freed_memory()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    init_from_environment(spec["arguments"]["settings"].get("device", "auto"))
    try:
        _worker(spec["worker"])(**spec["arguments"], output=spec["output"])
    except ValueError as refusal:
        line = " ".join(str(refusal).split())
        OneWriter.write(lambda: Path(spec["error"]).write_text(line))
        raise
    finally:
        leave()


if __name__ == "__main__":
    main(sys.argv[1])
