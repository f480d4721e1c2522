"""The workflow through a real one-node Slurm (slurmctld + slurmd + slurmdbd on localhost) and
snakemake-executor-plugin-slurm, with profiles/test-slurm: the naiss profile's keys, CPU float64.

Runs where the cluster can be brought up (root on Debian with its package archive, as in CI);
otherwise every test here is skipped with the reason. TINY_LLM_SLURM_TESTS=0 skips them on purpose.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = {"model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
       "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
       "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"}}
SETTINGS = {"noise_samples": 2, "random_samples": 2, "directions_per_pass": 4, "device": "cpu", "dtype": "float64"}

pytestmark = pytest.mark.slurm


def _unavailable() -> str | None:
    if os.environ.get("TINY_LLM_SLURM_TESTS") == "0":
        return "TINY_LLM_SLURM_TESTS=0"
    if os.geteuid() != 0:
        return "bringing up the local Slurm needs root (CI runs as root)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no apt-get to install Slurm from Debian's packages"
    return None


@pytest.fixture(scope="module")
def cluster():
    reason = _unavailable()
    if reason:
        pytest.skip(f"Slurm tests skipped: {reason}")
    was_running = subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0 if shutil.which("scontrol") else False
    started = subprocess.run(["bash", str(HERE / "start-local-slurm.sh")], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(f"Slurm tests skipped: the local cluster did not start:\n{started.stdout[-1500:]}{started.stderr[-1500:]}")
    yield
    if not was_running:
        subprocess.run(["bash", str(HERE / "stop-local-slurm.sh")], capture_output=True)


def _workdir(path: Path, analysis_settings: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.yaml").write_text(yaml.safe_dump(RUN))
    config = {"train_runs": {"tiny": {"config": str(path / "run.yaml"), "shard_tokens": 64}},
              "analyses": {"tiny": {"run": "runs/tiny", "settings": analysis_settings}}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def _command(workdir: Path, *args: str) -> list[str]:
    return [str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(workdir / "config.yaml"), *args]


def _run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    return subprocess.run(_command(workdir, *args), capture_output=True, text=True, env=env, cwd=workdir)


def _statistics(workdir: Path) -> dict:
    return {(p.parent.name, p.stem): json.loads(p.read_text())["statistics"]
            for p in sorted((workdir / "results/tiny/states").glob("*/*.json")) if p.stem != "done"}


def test_workflow_through_slurm_equals_local(cluster, tmp_path):
    slurm = _workdir(tmp_path / "slurm", SETTINGS)
    done = _run(slurm, "--profile", str(REPO / "profiles/test-slurm"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = sorted((slurm / "results/tiny/states").glob("*/seen.json"))
    assert len(results) == 3
    jobs = set()
    for seen in results:
        a, b = (json.loads((seen.parent / f"{case}.json").read_text())["slurm"] for case in ("seen", "unseen"))
        assert a["job_id"] == b["job_id"] and a["partition"] == "gpu"  # both cases of a state in one job
        jobs.add(a["job_id"])
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,State,Account"],
                           capture_output=True, text=True).stdout
    assert sacct.count("COMPLETED|naiss2026-3-205-gpu") == 3, sacct
    local = _workdir(tmp_path / "local", SETTINGS)
    assert _run(local, "-c2").returncode == 0
    assert _statistics(slurm) == _statistics(local)
    assert (slurm / "results/tiny/summary.csv").read_text() == (local / "results/tiny/summary.csv").read_text()
    jobs = json.loads((slurm / "results/tiny/campaign.json").read_text())["events"][-1]["jobs"]
    assert len(jobs) == 6 and all(j["slurm_job_id"] and j["node"] and j["attempt"] == 1 for j in jobs)


def _queued(name_prefix: str = "tinyllm_") -> list[str]:
    queue = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%k"], capture_output=True, text=True).stdout
    return [line for line in queue.splitlines() if line.split("|")[1].startswith(name_prefix)]


def test_cancelled_job_is_retried_and_the_campaign_completes(cluster, tmp_path):
    """scancel one running analysis job: sacct says "CANCELLED by <uid>", which the workflow hands
    to the plugin as CANCELLED (tiny_llm.slurm_states), so the controller sees a failed job within
    its polling interval, retries it, and completes on its own, every other result kept."""
    workdir = _workdir(tmp_path / "cancel", SETTINGS)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    profile = ["--profile", str(REPO / "profiles/test-slurm"), "--retries", "1"]
    process = subprocess.Popen(_command(workdir, *profile), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=workdir)
    cancelled = None
    deadline = time.time() + 300
    while cancelled is None and time.time() < deadline and process.poll() is None:
        for line in _queued():
            job, _, state, comment = line.split("|", 3)
            if state == "RUNNING" and "analysis" in comment:
                subprocess.run(["scancel", job], check=True)
                cancelled = job
                break
        time.sleep(0.5)
    try:
        output = process.communicate(timeout=400)[0]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=120)[0]
        raise AssertionError(f"the controller did not finish after the scancel:\n{output[-4000:]}") from None
    assert cancelled, f"no analysis job was seen running:\n{output[-3000:]}"
    assert process.returncode == 0, output[-4000:]
    state = subprocess.run(["sacct", "-X", "-n", "-P", "-j", cancelled, "-o", "State"], capture_output=True,
                           text=True).stdout
    assert state.startswith("CANCELLED by")  # what sacct really says
    assert f"SLURM-job '{cancelled}' failed" in output or "CANCELLED" in output
    results = workdir / "results/tiny/states"
    assert len(list(results.glob("*/seen.json"))) == len(list(results.glob("*/unseen.json"))) == 3
    assert (workdir / "results/tiny/summary.csv").exists()
    finished = {p: p.stat().st_mtime_ns for p in results.glob("*/*.json")}
    rerun = _run(workdir, *profile)  # nothing left to do
    assert rerun.returncode == 0 and all(p.stat().st_mtime_ns == t for p, t in finished.items())


def test_accounting_outage_is_survived(cluster, tmp_path):
    """Stop slurmdbd for 30 s while jobs run: with polling throttled like profiles/naiss (there one
    check per 20 s x 30 attempts; here 0.1/s x 10 attempts, ~100 s of tolerance) the plugin rides
    it out instead of forgetting its jobs (plugin issue #207), and the run completes."""
    workdir = _workdir(tmp_path / "outage", SETTINGS)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    args = ["--profile", str(REPO / "profiles/test-slurm"), "--max-status-checks-per-second", "0.1",
            "--slurm-status-attempts", "10"]
    process = subprocess.Popen(_command(workdir, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, cwd=workdir)
    deadline = time.time() + 300
    while not any("analysis" in line for line in _queued()) and time.time() < deadline and process.poll() is None:
        time.sleep(0.5)
    pid = int(Path("/run/slurmdbd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    time.sleep(30)
    assert subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode != 0  # accounting is down
    subprocess.run(["/usr/sbin/slurmdbd"], check=True)
    time.sleep(1)
    with open("/run/local-slurm/pids", "a") as pids:  # so stop-local-slurm.sh stops the new one
        pids.write(f"slurmdbd {Path('/run/slurmdbd.pid').read_text().strip()}\n")
    output = process.communicate(timeout=900)[0]
    assert process.returncode == 0, output[-4000:]
    assert len(list((workdir / "results/tiny/states").glob("*/unseen.json"))) == 3
