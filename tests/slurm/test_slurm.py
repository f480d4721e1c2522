"""The workflow through a real one-node Slurm (slurmctld + slurmd + slurmdbd on localhost) and
snakemake-executor-plugin-slurm, with profiles/test-slurm: the naiss profile's keys, CPU float64.

Runs when asked (TINY_LLM_SLURM_TESTS=1, which CI sets: as root on Debian the local cluster is
installed and started, and stopped afterwards) or when the local test cluster already answers;
otherwise every test here is skipped with the reason. A plain `make test` installs nothing
system-wide, and never submits to a site's real Slurm. TINY_LLM_SLURM_TESTS=0 skips them always.
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

from tiny_llm.provenance import source_hash
from tiny_llm.workers.settings import settings_from_dict
from tiny_llm.workers.state import analyze_state

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"},
}
SETTINGS = {"noise_samples": 2, "random_samples": 2, "directions_per_pass": 4, "device": "cpu", "dtype": "float64"}

pytestmark = pytest.mark.slurm
CONTROLLER = pytest.mark.slow
"""The controller's own recovery (a cancelled job retried, an accounting outage, a killed controller
re-attached, Ctrl-C): about 5 minutes of mostly waiting, run by `make test-slow` with
TINY_LLM_SLURM_TESTS=1 rather than on every CI run (which keeps the workflow through Slurm, the
group jobs, short states sharing a job and the two-node killed rank)."""


LOCAL_CLUSTER = "localcluster"
"""The ClusterName start-local-slurm.sh gives its one-node cluster."""


def _local_cluster_answers() -> bool:
    if not shutil.which("scontrol"):
        return False
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    return shown.returncode == 0 and any(
        line.split("=", 1)[-1].strip() == LOCAL_CLUSTER
        for line in shown.stdout.splitlines()
        if line.startswith("ClusterName")
    )


def _unavailable() -> str | None:
    flag = os.environ.get("TINY_LLM_SLURM_TESTS")
    if flag == "0":
        return "TINY_LLM_SLURM_TESTS=0"
    if flag != "1" and not _local_cluster_answers():
        return (
            "not asked: TINY_LLM_SLURM_TESTS=1 make test installs and starts a local one-node Slurm "
            "(root, Debian), as CI does"
        )
    if os.geteuid() != 0 and not _local_cluster_answers():
        return "bringing up the local Slurm needs root (CI runs as root)"
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        return "no apt-get to install Slurm from Debian's packages"
    return None


@pytest.fixture(scope="module")
def cluster():
    reason = _unavailable()
    if reason:
        pytest.skip(f"Slurm tests skipped: {reason}")
    was_running = (
        subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0 if shutil.which("scontrol") else False
    )
    started = subprocess.run(["bash", str(HERE / "start-local-slurm.sh")], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(
            f"Slurm tests skipped: the local cluster did not start:\n{started.stdout[-1500:]}{started.stderr[-1500:]}"
        )
    yield
    if not was_running:
        subprocess.run(["bash", str(HERE / "stop-local-slurm.sh")], capture_output=True)


def _workdir(path: Path, analysis_settings: dict, trained: Path | None = None) -> Path:
    """A project for the tiny run; with ``trained``, its cache and run copied from there (files and
    times as they are), so that only the analysis part of the campaign is left to do."""
    path.mkdir(parents=True, exist_ok=True)
    if trained:
        for part in ("cache", "runs"):
            shutil.copytree(trained / part, path / part, symlinks=True)
        shutil.copy2(trained / "run.yaml", path / "run.yaml")
    else:
        (path / "run.yaml").write_text(yaml.safe_dump(RUN))
    config = {
        "train_runs": {"tiny": {"config": str(path / "run.yaml"), "shard_tokens": 64}},
        "analyses": {"tiny": {"run": "runs/tiny", "settings": analysis_settings}},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def _command(workdir: Path, *args: str) -> list[str]:
    return [
        str(SNAKEMAKE),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        *args,
    ]


def _run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    return subprocess.run(_command(workdir, *args), capture_output=True, text=True, env=env, cwd=workdir)


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory) -> Path:
    """The tiny run prepared and trained once, locally. Training through Slurm is exercised by
    the end-to-end test; the others start from a copy and exercise the analysis jobs."""
    path = _workdir(tmp_path_factory.mktemp("trained"), SETTINGS)
    done = _run(path, "-c2", "runs/tiny/trained.json")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return path


def _statistics(workdir: Path) -> dict:
    return {
        (p.parent.name, p.stem): json.loads(p.read_text())["statistics"]
        for p in sorted((workdir / "results/tiny/states").glob("*/*.json"))
        if p.stem != "done"
    }


def test_workflow_through_slurm_equals_local(cluster, trained, tmp_path):
    """The whole campaign through Slurm (training too) gives a local run's numbers. It also runs the
    code it started with: a numerical module edited once the first job is submitted changes
    nothing for the jobs still to come (they import the run's frozen copy), and the next campaign
    sees the edit and the identity guard refuses to mix it into the existing results."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "src/tiny_llm", source / "tiny_llm", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(source)}
    slurm = _workdir(tmp_path / "slurm", SETTINGS)
    log = slurm / "campaign.log"
    campaign = _start(slurm, log, "--profile", str(REPO / "profiles/test-slurm"), env=env)
    _until(lambda: "has been submitted with SLURM jobid" in log.read_text(), 120, "the first Slurm job")
    noise = source / "tiny_llm/curvature/noise.py"
    noise.write_text(noise.read_text() + "\n# edited while the campaign runs\n")
    assert campaign.wait(timeout=900) == 0, log.read_text()[-4000:]
    results = sorted((slurm / "results/tiny/states").glob("*/seen.json"))
    assert len(results) == 3
    assert {
        json.loads(p.read_text())["identity"]["source"]
        for p in (slurm / "results/tiny/states").glob("*/*.json")
        if p.stem != "done"
    } == {source_hash()}  # the code as it was at the start
    jobs = set()
    for seen in results:
        a, b = (json.loads((seen.parent / f"{case}.json").read_text())["slurm"] for case in ("seen", "unseen"))
        assert a["job_id"] == b["job_id"] and a["partition"] == "gpu"  # both cases of a state in one job
        jobs.add(a["job_id"])
    sacct = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,State,Account"], capture_output=True, text=True
    ).stdout
    assert sacct.count("COMPLETED|naiss2026-3-205-gpu") == 3, sacct
    local = _workdir(tmp_path / "local", SETTINGS, trained)  # trained locally
    assert _run(local, "-c2").returncode == 0
    assert _statistics(slurm) == _statistics(local)
    assert (slurm / "results/tiny/summary.csv").read_text() == (local / "results/tiny/summary.csv").read_text()
    jobs = json.loads((slurm / "results/tiny/campaign.json").read_text())["events"][-1]["jobs"]
    assert len(jobs) == 6 and all(j["slurm_job_id"] and j["node"] and j["attempt"] == 1 for j in jobs)
    assert all(
        j["requested"]["runtime"] > 0
        and j["requested"]["cpus_per_task"] == 1
        and j["requested"]["threads"] == 1
        and j["requested"]["slurm_account"] == "naiss2026-3-205-gpu"
        for j in jobs
    )
    again = subprocess.run(
        _command(slurm, "--profile", str(REPO / "profiles/test-slurm"), "-n"),
        capture_output=True,
        text=True,
        cwd=slurm,
        env={**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}", **env},
    )
    assert again.returncode != 0 and "the tiny_llm source code changed" in again.stderr + again.stdout


GPU_JOB = (
    "--set-resource-scopes",
    "gpu=local",
    "state_slot=local",
    "--resources",
    "gpu=4",
    "state_slot=1",
    "--set-resources",
    *(
        f"{rule}:{key}={value}"
        for rule in ("analyze_state", "finish_state")
        for key, value in (("gpu_model", "gh200"), ("cpus_per_task", 0), ("cpus_per_gpu", 1), ("mem_mb_per_cpu", 400))
    ),
    "analyze_state:gpu=2",
)
"""The naiss profile's GPU request for a group job, sized for this node: its scopes and state slot,
GH200s by type, CPUs and memory per GPU. The analysis runs on CPU, so the workflow itself asks for
no GPU (gpu=0); the request is imposed, as a GPU analysis would make it."""


def test_group_job_holds_its_gpus_and_runs_its_ranks(cluster, trained, tmp_path):
    """gpus_per_job: 2 through sbatch as profiles/naiss asks for it (--gpus=gh200:2 --cpus-per-gpu):
    Slurm accepts the request and gives the state's one job two GPUs (fake ones here); both cases
    run on two torchrun ranks, one after another (Snakemake starts them together inside the job;
    the second waits for the job's device lock), and the numbers are a one-process local run's."""
    workdir = _workdir(tmp_path / "gpus", SETTINGS, trained)
    checkpoint = sorted(p.name for p in (workdir / "runs/tiny").glob("epoch-*.safetensors"))[0]
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["analyses"]["tiny"].update(checkpoints=[checkpoint], gpus_per_job=2)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    done = _run(workdir, "--profile", str(REPO / "profiles/test-slurm"), *GPU_JOB)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = {
        p.stem: json.loads(p.read_text())
        for p in (workdir / "results/tiny/states").glob("*/*.json")
        if p.stem != "done"
    }
    assert sorted(results) == ["seen", "unseen"]
    jobs = {r["slurm"]["job_id"] for r in results.values()}
    assert len(jobs) == 1  # the state's cases in one job, one after another on its GPUs
    logs = [p.read_text() for p in (workdir / "logs/analyze_state/tiny").glob("*/*.log")]
    assert sum("waiting until this job's devices are free" in log for log in logs) == 1, logs
    for result in results.values():
        assert result["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": False}
        assert result["slurm"]["gpus"] == "0,1"  # the two GPUs Slurm gave the job
        assert {key: result["slurm"]["requested"][key] for key in ("gpu", "gpu_model", "cpus_per_gpu")} == {
            "gpu": 2,
            "gpu_model": "gh200",
            "cpus_per_gpu": 1,
        }
    allocated = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", jobs.pop(), "-o", "State,AllocTRES"], capture_output=True, text=True
    ).stdout
    assert allocated.startswith("COMPLETED|") and "gres/gpu=2" in allocated and "cpu=2" in allocated, allocated
    os.chdir(workdir)
    try:
        for case, result in results.items():  # the same state and case in this process, alone
            alone = analyze_state(
                "runs/tiny",
                [a["file"] for a in result["state"]["aliases"]],
                case,
                settings_from_dict(SETTINGS),
                tmp_path / f"{case}.json",
            )
            for key, value in alone["statistics"].items():
                assert result["statistics"][key] == (
                    None if value is None else pytest.approx(value, rel=1e-10, abs=1e-14)
                ), key
    finally:
        os.chdir(REPO)


def test_short_states_share_a_job_one_after_another(cluster, trained, tmp_path):
    """cluster.states_per_job: 2 (what auto decides for short states under the walltime estimate):
    the three states run in two Slurm jobs, their cases one after another in each, and every
    result is there once; the walltime Slurm was given is the sum of the group's jobs."""
    workdir = _workdir(tmp_path / "packed", SETTINGS, trained)
    done = _run(
        workdir,
        "--profile",
        str(REPO / "profiles/test-slurm"),
        "--config",
        'cluster={"walltime": "none", "reattach_poll_seconds": 2, "states_per_job": 2}',
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = [
        json.loads(p.read_text()) for p in (workdir / "results/tiny/states").glob("*/*.json") if p.stem != "done"
    ]
    assert len(results) == 6
    by_job: dict[str, set[str]] = {}
    for result in results:
        by_job.setdefault(result["slurm"]["job_id"], set()).add(result["state"]["key"])
    assert sorted(len(states) for states in by_job.values()) == [1, 2], by_job
    limits = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(by_job), "-o", "JobID,State,Timelimit"],
        capture_output=True,
        text=True,
    ).stdout
    assert limits.count("COMPLETED") == 2, limits


def _queued(name_prefix: str = "tinyllm_") -> list[str]:
    queue = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%k"], capture_output=True, text=True).stdout
    return [line for line in queue.splitlines() if line.split("|")[1].startswith(name_prefix)]


@CONTROLLER
def test_cancelled_job_is_retried_and_the_campaign_completes(cluster, trained, tmp_path):
    """scancel one running analysis job: sacct says "CANCELLED by <uid>", which the workflow hands
    to the plugin as CANCELLED (tiny_llm.campaign.slurm_states), so the controller sees a failed job within
    its polling interval, retries it, and completes on its own, every other result kept."""
    workdir = _workdir(tmp_path / "cancel", SETTINGS, trained)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    profile = ["--profile", str(REPO / "profiles/test-slurm"), "--retries", "1"]
    process = subprocess.Popen(
        _command(workdir, *profile), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir
    )
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
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", cancelled, "-o", "State"], capture_output=True, text=True
    ).stdout
    assert state.startswith("CANCELLED by")  # what sacct really says
    # The controller saw the failure: its error block names the cancelled job's Slurm log (the
    # log's own text, CANCELLED, is no longer echoed: show-failed-logs is off).
    assert f"/{cancelled}.log (check log file(s) for error details)" in output, output[-4000:]
    results = workdir / "results/tiny/states"
    assert len(list(results.glob("*/seen.json"))) == len(list(results.glob("*/unseen.json"))) == 3
    assert (workdir / "results/tiny/summary.csv").exists()
    finished = {p: p.stat().st_mtime_ns for p in results.glob("*/*.json")}
    rerun = _run(workdir, *profile)  # nothing left to do
    assert rerun.returncode == 0 and all(p.stat().st_mtime_ns == t for p, t in finished.items())


@CONTROLLER
def test_accounting_outage_is_survived(cluster, trained, tmp_path):
    """Stop slurmdbd for 30 s while jobs run: with polling throttled like profiles/naiss (there one
    check per 20 s x 30 attempts; here 0.1/s x 10 attempts, ~100 s of tolerance) the plugin rides
    it out instead of forgetting its jobs (plugin issue #207), and the run completes."""
    workdir = _workdir(tmp_path / "outage", SETTINGS, trained)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    args = [
        "--profile",
        str(REPO / "profiles/test-slurm"),
        "--max-status-checks-per-second",
        "0.1",
        "--slurm-status-attempts",
        "10",
    ]
    process = subprocess.Popen(
        _command(workdir, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir
    )
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


def _start(workdir: Path, log: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A controller in the background, its output in ``log``."""
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}", **(env or {})}
    # Ctrl-C must reach it even when the tests themselves run in the background, where the shell
    # starts them with SIGINT ignored (a state that children inherit).
    return subprocess.Popen(
        _command(workdir, *args),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=workdir,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _until(condition, seconds: float, what: str):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _analysis_jobs(state: str) -> list[str]:
    """Ids of the analysis jobs in ``state``, in submission order."""
    return sorted(
        (line.split("|")[0] for line in _queued() if line.split("|")[2] == state and "analysis" in line.split("|")[3]),
        key=int,
    )


HELD = ("--set-resources", "analyze_state:slurm_extra='--hold'")
"""For a first controller only: its analysis jobs are submitted held, so the test decides which run."""


def _two_running_one_queued() -> tuple[list[str], list[str]]:
    """With the first controller's three analysis jobs submitted held: release two, wait until they
    run, suspend them; the third stays queued. Both kinds exist whatever the timing (the test
    resumes the suspended ones)."""
    held = _until(
        lambda: (lambda jobs: jobs if len(jobs) == 3 else None)(_analysis_jobs("PENDING")),
        300,
        "three held analysis jobs",
    )
    running, queued = held[:2], held[2:]
    for job in running:
        subprocess.run(["scontrol", "release", job], check=True)
    _until(lambda: set(running) <= set(_analysis_jobs("RUNNING")), 120, "the released jobs running")
    for job in running:
        subprocess.run(["scontrol", "suspend", job], check=True)
    return running, queued


def _cancel_jobs_of(workdir: Path) -> None:
    """Whatever a failed test left in the queue for ``workdir`` (suspended jobs hold the CPUs)."""
    queue = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True).stdout
    jobs = [line.split("|")[0] for line in queue.splitlines() if line.split("|")[-1] == str(workdir)]
    if jobs:
        subprocess.run(["scancel", *jobs], check=False)


def _result_jobs(workdir: Path) -> dict[tuple[str, str], str]:
    return {
        (p.parent.name, p.stem): json.loads(p.read_text())["slurm"]["job_id"]
        for p in (workdir / "results/tiny/states").glob("*/*.json")
        if p.stem != "done"
    }


def _sacct_state(job: str) -> str:
    return subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"], capture_output=True, text=True
    ).stdout.strip()


@CONTROLLER
def test_killed_controller_is_re_attached_without_duplicate_work(cluster, trained, tmp_path):
    """SIGKILL the controller while analysis jobs run and one is queued, unlock, start it again:
    the running jobs are awaited (not submitted again), the queued one is cancelled and
    resubmitted, every state is computed by exactly one job that ran to completion."""
    workdir = _workdir(tmp_path / "killed", SETTINGS, trained)
    profile = ["--profile", str(REPO / "profiles/test-slurm")]
    first = _start(workdir, workdir / "first.log", *profile, *HELD)
    try:
        running, queued = _two_running_one_queued()
    finally:
        first.kill()  # SIGKILL: no clean-up, Snakemake's lock stays
        first.wait()
    try:
        assert _run(workdir, *profile, "-n").returncode == 0  # a dry run does not need the lock
        assert _run(workdir, *profile, "--unlock").returncode == 0
        log = workdir / "second.log"
        second = _start(workdir, log, *profile)
        try:
            _until(lambda: "Re-attached" in log.read_text(), 120, "the re-attach message")
        finally:
            for job in running:
                subprocess.run(["scontrol", "resume", job], check=False)
        assert second.wait(timeout=400) == 0, log.read_text()[-4000:]
    finally:
        _cancel_jobs_of(workdir)
    output = log.read_text()
    assert f"Cancelled {len(queued)} queued Slurm job(s) of an earlier controller ({' '.join(queued)})" in output
    assert f"Re-attached to {len(running)} running Slurm job(s)" in output
    assert all(_sacct_state(job).startswith("CANCELLED") for job in queued)
    assert all(_sacct_state(job) == "COMPLETED" for job in running)
    jobs = _result_jobs(workdir)
    assert len(jobs) == 6 and set(running) <= set(jobs.values())
    resubmitted = set(jobs.values()) - set(running)  # only the cancelled state's work is redone
    assert len(resubmitted) == 1 and output.count("has been submitted with SLURM jobid") == 1
    assert all(_sacct_state(job) == "COMPLETED" for job in resubmitted)
    rerun = _run(workdir, *profile, "-n")
    assert "Nothing to be done" in rerun.stdout + rerun.stderr  # awaited results count as made


@CONTROLLER
def test_ctrl_c_leaves_running_jobs_running(cluster, trained, tmp_path):
    """SIGINT (Ctrl-C) cancels the queued jobs and leaves the running ones running; the next
    run re-attaches to them or finds their results, and the campaign completes."""
    workdir = _workdir(tmp_path / "interrupted", SETTINGS, trained)
    profile = ["--profile", str(REPO / "profiles/test-slurm")]
    log = workdir / "first.log"
    first = _start(workdir, log, *profile, *HELD)
    try:
        running, queued = _two_running_one_queued()
        try:
            first.send_signal(signal.SIGINT)
            first.wait(timeout=120)
            output = log.read_text()
            assert (
                f"Interrupted: {len(queued)} queued Slurm job(s) cancelled; {len(running)} running job(s) "
                f"keep running ({' '.join(running)})"
            ) in output, output[-3000:]
            assert all(_sacct_state(job).startswith("CANCELLED") for job in queued)
            assert set(running) <= set(_analysis_jobs("SUSPENDED"))  # still there, not cancelled
        finally:
            for job in running:
                subprocess.run(["scontrol", "resume", job], check=False)
    except BaseException:
        first.kill()
        _cancel_jobs_of(workdir)
        raise
    done = _run(workdir, *profile)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert all(_sacct_state(job) == "COMPLETED" for job in running)
    jobs = _result_jobs(workdir)
    assert len(jobs) == 6 and set(running) <= set(jobs.values())


TWO_NODES = {"SLURM_CONF": "/run/two-node-slurm/slurm.conf", "GLOO_SOCKET_IFNAME": "tl0"}
"""What reaches start-two-node-slurm.sh's cluster, and gloo's interface on both of its nodes."""


@pytest.fixture(scope="module")
def two_nodes(cluster):
    """A second, two-node Slurm cluster on this machine (tests/slurm/start-two-node-slurm.sh: its
    second slurmd in a network namespace of its own), stopped afterwards."""
    started = subprocess.run(["bash", str(HERE / "start-two-node-slurm.sh")], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(f"the two-node cluster did not start:\n{started.stdout[-1500:]}{started.stderr[-1500:]}")
    yield TWO_NODES
    subprocess.run(["bash", str(HERE / "stop-two-node-slurm.sh")], capture_output=True)


def _rank_on_node2() -> int | None:
    """The pid of a rank (not its torchrun) running on the second node, if there is one."""
    listed = subprocess.run(["ip", "netns", "pids", "tl-node2"], capture_output=True, text=True).stdout.split()
    for pid in listed:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tiny_llm.workers.ranks" in command and b"torch.distributed.run" not in command:
            return int(pid)
    return None


@pytest.mark.slow  # about 3 minutes: make test-slow (the one-node Slurm tests above stay in make test)
def test_two_node_sharded_analysis_survives_a_killed_rank(two_nodes, trained, tmp_path):
    """nodes_per_job: 2 with settings.sharded through the naiss-style profile on a two-node cluster:
    the job's srun --overlap starts torchrun on both nodes, which meet by c10d rendezvous at the
    first node and shard the model over the two. A rank killed on the second node fails the job
    with no result written; the retry completes, equal to one process."""
    settings = {**SETTINGS, "sharded": True}
    workdir = _workdir(tmp_path / "two-nodes", settings, trained)
    checkpoint = sorted(p.name for p in (workdir / "runs/tiny").glob("epoch-*.safetensors"))[0]
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["analyses"]["tiny"].update(checkpoints=[checkpoint], cases=["seen"], nodes_per_job=2)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    log = workdir / "campaign.log"
    campaign = _start(
        workdir,
        log,
        "--profile",
        str(REPO / "profiles/test-slurm"),
        "--retries",
        "2",  # one for the killed rank, one for a start that this shared 2-core machine may fail
        "--slurm-status-command",
        "squeue",  # no accounting on this cluster
        "--slurm-no-account",
        "--default-resources",
        "slurm_partition=two",
        "runtime=10",
        "mem_mb=500",
        "cpus_per_task=1",
        env=two_nodes,
    )
    try:
        victim = _until(_rank_on_node2, 300, "a rank on the second node")
        os.kill(victim, signal.SIGKILL)
        assert campaign.wait(timeout=600) == 0, log.read_text()[-4000:]
    finally:
        if campaign.poll() is None:
            campaign.kill()
    results = list((workdir / "results/tiny/states").glob("*/seen.json"))
    assert len(results) == 1, log.read_text()[-3000:]
    result = json.loads(results[0].read_text())
    assert result["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": True}
    # The first attempt failed without a result; the retry's ran from the first node over both.
    assert result["slurm"]["attempt"] >= 2 and result["slurm"]["node"] == "tlnode1", result["slurm"]
    assert result["slurm"]["requested"]["nodes"] == 2, result["slurm"]["requested"]
    os.chdir(workdir)
    try:
        alone = analyze_state("runs/tiny", [checkpoint], "seen", settings_from_dict(settings), tmp_path / "alone.json")
    finally:
        os.chdir(REPO)
    for key, value in alone["statistics"].items():
        assert result["statistics"][key] == (None if value is None else pytest.approx(value, rel=1e-10, abs=1e-14)), key
