"""The real Snakemake workflow on a tiny configuration in a temporary directory: an ordinary and a
packed run trained, indexed, analysed, collected and plotted; reuse, refusal and partial reruns."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_llm.workers.settings import settings_from_dict
from tiny_llm.workers.state import analyze_state

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")

TINY_RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"},
}
SAME_THREADS = ("--set-threads", "analyze_state=2")
"""The fixture's analyses run on two threads; a test that recomputes a result and compares it bit
for bit asks for the same (another thread count sums in another order: the last bits differ)."""
SETTINGS = {"noise_samples": 2, "random_samples": 2, "device": "cpu", "dtype": "float64", "directions_per_pass": 4}


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(workdir / "config.yaml"),
            "-c2",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )


def _write_config(workdir: Path, lr: float = 0.003, seed: int = 42) -> None:
    (workdir / "run.yaml").write_text(yaml.safe_dump(TINY_RUN))
    runs = {
        "tiny": {"config": str(workdir / "run.yaml"), "set": {"training.lr": lr}, "shard_tokens": 64},
        "packed": {
            "config": str(workdir / "run.yaml"),
            "set": {
                "data.cache": "cache/packed",
                "training.tokens": 1024,
                "training.packed": {"workers": 2, "sync_every": 3},
            },
            "shard_tokens": 64,
        },
    }
    spectrum = {
        "enabled": True,
        "top_k": 2,
        "lanczos_steps": 6,
        "slq_vectors": 1,
        "slq_steps": 5,
        "block_samples": 1,
        "cg_max_iterations": 5,
    }
    analyses = {
        "tiny": {"run": "runs/tiny", "settings": {**SETTINGS, "seed": seed}, "spectrum": spectrum},
        "packed": {
            "run": "runs/packed",
            "checkpoints": ["epoch-001.safetensors", "final.pt"],
            "cases": ["seen"],
            "settings": {**SETTINGS, "sharded": True},
            "gpus_per_job": 2,
            "spectrum": {**spectrum, "top_k": 1},
        },
    }
    config = {"train_runs": runs, "analyses": analyses, "plots": {"training_norms": True}}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))


def _summary(workdir: Path, analysis: str) -> list[dict]:
    with open(workdir / "results" / analysis / "summary.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("workflow")
    _write_config(path)
    done = _snakemake(path, *SAME_THREADS)
    assert done.returncode == 0, done.stderr[-4000:]
    return path


def test_end_to_end_outputs(workdir):
    run = workdir / "runs/tiny"
    assert sorted(p.name for p in run.glob("epoch-*.safetensors")) == [
        "epoch-000.safetensors",
        "epoch-001.safetensors",
        "epoch-002.safetensors",
    ]
    assert json.loads((run / "trained.json").read_text())["position"]["step"] == 8
    results = workdir / "results/tiny"
    states = json.loads((results / "states.json").read_text())["states"]
    assert [[a["file"] for a in s["aliases"]] for s in states] == [
        ["epoch-000.safetensors"],
        ["epoch-001.safetensors"],
        ["epoch-002.safetensors", "final.pt"],
    ]
    for figure in ("normalized_alignment", "noise_alignment", "gradient_norms", "batch_sizes", "block_batch_sizes"):
        assert (results / "figures" / f"{figure}.pdf").stat().st_size > 1000
        assert (results / "figures" / f"{figure}.png").stat().st_size > 1000
    with open(results / "blocks.csv") as handle:  # 4 aliases × 2 cases × (embedding, attention, MLP, norms)
        blocks = list(csv.DictReader(handle))
    assert len(blocks) == 4 * 2 * 4 and [b["block"] for b in blocks[:4]] == [
        "embedding",
        "layer 0 attention",
        "layer 0 mlp",
        "norms",
    ]
    assert all(float(b["b_simple"]) > 0 for b in blocks)
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest["cases"] == ["seen", "unseen"] and len(manifest["states"]) == 3
    assert manifest["precision"]["dtype"] == "float64" and manifest["batch_sizes"]["seen"]["micro_batch_size"] == 3
    # torch uses the rule's threads: 2 as set for analyze_state, 1 (the rule's default) for spectra
    assert {h["torch_threads"] for h in manifest["hardware"]} == {2}
    spectrum = json.loads(next((results / "spectra").glob("*/seen.json")).read_text())
    assert spectrum["hardware"]["torch_threads"] == 1
    # The campaign record: this run's start, then its collection with every (state, case) job
    events = json.loads((results / "campaign.json").read_text())["events"]
    assert [e["event"] for e in events] == ["start", "collected"]
    assert events[0]["cost"].startswith("analysis tiny: ≤ 3 states") and events[0]["source"] == events[1]["source"]
    assert len(events[1]["jobs"]) == 6 and all(j["slurm_job_id"] is None for j in events[1]["jobs"])


def test_spectra_are_collected_and_plotted(workdir):
    results = workdir / "results/tiny"
    with open(results / "spectrum.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["file"], r["case"]) for r in rows][:2] == [
        ("epoch-000.safetensors", "seen"),
        ("epoch-000.safetensors", "unseen"),
    ]
    assert len(rows) == 8 and float(rows[-1]["la_eigenvalue_1"]) >= float(rows[-1]["la_eigenvalue_2"])
    assert all(0 <= float(r["block_tensor_relative_error"]) for r in rows)
    for figure in ("top_eigenvalues", "slq_density", "block_diagonal_error"):
        assert (results / "figures" / f"{figure}.png").stat().st_size > 1000
    assert len(list((results / "figures/slq_states").glob("*.png"))) == 3  # one per state
    seen = next((results / "spectra").glob("*/seen.json"))
    states = json.loads((seen.parent.parent.parent / "states" / seen.parent.name / "seen.json").read_text())["slurm"]
    assert states is None  # local run
    assert not (results / "figures" / "top_eigenvalues.pdf").stat().st_size == 0


def test_aliases_are_measured_once_and_listed_by_name(workdir):
    rows = _summary(workdir, "tiny")
    assert [(r["file"], r["case"]) for r in rows][-4:] == [
        ("epoch-002.safetensors", "seen"),
        ("epoch-002.safetensors", "unseen"),
        ("final.pt", "seen"),
        ("final.pt", "unseen"),
    ]
    assert rows[-1]["state_key"] == rows[-3]["state_key"] and rows[-1]["noise_curvature"] == rows[-3]["noise_curvature"]
    assert len(list((workdir / "results/tiny/states").glob("*/seen.json"))) == 3
    assert rows[0]["consensus_mean_curvature"] == ""  # blank for an ordinary run
    # Every result lists the aliases the manifest lists for its state (the last state has two).
    manifest = json.loads((workdir / "results/tiny/manifest.json").read_text())
    for state in manifest["states"]:
        for path in state["results"].values():
            result = json.loads((workdir / "results/tiny" / path).read_text())
            assert [a["file"] for a in result["state"]["aliases"]] == [a["file"] for a in state["aliases"]]
    assert [a["file"] for a in manifest["states"][-1]["aliases"]] == ["epoch-002.safetensors", "final.pt"]


def test_summary_matches_the_worker(workdir, tmp_path):
    rows = [r for r in _summary(workdir, "tiny") if r["file"] == "epoch-001.safetensors" and r["case"] == "unseen"]
    saved = json.loads((workdir / "results/tiny/states" / rows[0]["state_key"] / "unseen.json").read_text())
    for key, value in saved["statistics"].items():
        assert rows[0][key] == ("" if value is None else repr(value))
    os.chdir(workdir)  # the run's resolved.yaml names its cache relative to the workflow directory
    try:
        direct = analyze_state(
            "runs/tiny",
            ["epoch-001.safetensors"],
            "unseen",
            settings_from_dict(SETTINGS),
            tmp_path / "direct.json",
            successor=saved["trajectory"]["successor"],
        )
    finally:
        os.chdir(REPO)
    assert direct["statistics"] == saved["statistics"]
    assert saved["trajectory"]["successor"]["file"] == "epoch-002.safetensors"


def test_the_step_to_the_next_checkpoint(workdir):
    """The trajectory statistics: along the step from each checkpoint to the next, the loss change
    measured at the next one is that one's own epoch loss minus this one's (the same epoch); the
    quadratic model's prediction and best step beside it; the last checkpoint has none."""
    rows = _summary(workdir, "tiny")
    for case in ("seen", "unseen"):
        first = {}
        for row in rows:
            if row["case"] == case:
                first.setdefault(row["state_key"], row)
        ordered = list(first.values())
        for this, following in zip(ordered, ordered[1:], strict=False):
            change = float(following["loss"]) - float(this["loss"])
            assert float(this["actual_loss_change"]) == pytest.approx(change, rel=1e-9, abs=1e-12)
            predicted = float(this["step_grad_dot"]) + 0.5 * float(this["step_curvature"])
            assert float(this["predicted_loss_change"]) == pytest.approx(predicted, rel=1e-12)
            assert float(this["step_norm"]) > 0 and this["step_gauss_newton"] != ""
        assert all(ordered[-1][k] == "" for k in ("step_curvature", "actual_loss_change", "optimal_step"))


def test_packed_consensus_columns(workdir):
    rows = _summary(workdir, "packed")
    assert [r["file"] for r in rows] == ["epoch-001.safetensors", "final.pt"] and {r["case"] for r in rows} == {"seen"}
    assert all(float(r["consensus_mean_norm"]) > 0 for r in rows)
    manifest = json.loads((workdir / "results/packed/manifest.json").read_text())
    assert manifest["consensus"] and manifest["states"][0]["worker_hashes"] and manifest["workers"] == 2


def test_gpus_per_job_runs_each_job_on_ranks(workdir, tmp_path):
    """gpus_per_job: 2 with settings.sharded runs each (state, case) job of packed under torchrun on 2
    CPU processes, the model sharded over both ranks (FSDP2): the statistics (consensus errors
    included) of a single-process call, exact Taylor-mode forms, and its spectra sharded too."""
    state = json.loads(next((workdir / "results/packed/states").glob("*/seen.json")).read_text())
    assert state["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": True}
    assert state["precision"]["engine"] == "taylor" and state["consensus"]["workers"]
    spectrum = json.loads(next((workdir / "results/packed/spectra").glob("*/seen.json")).read_text())
    assert spectrum["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": True}
    assert spectrum["precision"]["engine"] == "finite_difference"
    os.chdir(workdir)
    try:
        direct = analyze_state(
            "runs/packed",
            [a["file"] for a in state["state"]["aliases"]],
            "seen",
            settings_from_dict({**SETTINGS, "sharded": True}),  # one process: whole, the same engine
            tmp_path / "direct.json",
        )
    finally:
        os.chdir(REPO)
    for key, value in direct["statistics"].items():
        assert state["statistics"][key] == (None if value is None else pytest.approx(value, rel=1e-10, abs=1e-14)), key
    cost = json.loads((workdir / "results/packed/campaign.json").read_text())["events"][0]["cost"]
    assert "split over 2 CPU processes" in cost


def test_rerun_is_a_no_op(workdir):
    dry = _snakemake(workdir, "-n")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr


def test_changed_settings_stop_before_any_work(workdir):
    before = (workdir / "results/tiny/summary.csv").read_bytes()
    _write_config(workdir, seed=7)
    try:
        changed = _snakemake(workdir)
    finally:
        _write_config(workdir)
    assert changed.returncode != 0
    assert "results/tiny holds results made with other settings (settings.seed: 42 -> 7)" in changed.stderr
    assert "use a new output directory" in changed.stderr
    assert (workdir / "results/tiny/summary.csv").read_bytes() == before
    _write_config(workdir, lr=0.001)
    try:
        retrain = _snakemake(workdir)
    finally:
        _write_config(workdir)
    assert retrain.returncode != 0 and "other settings (training.lr: 0.003 -> 0.001)" in retrain.stdout + retrain.stderr
    assert (workdir / "runs/tiny/final.pt").exists()
    assert _snakemake(workdir).returncode == 0  # restored settings: only receipts are rewritten


def test_plot_target_redraws_without_recomputing(workdir):
    results = workdir / "results/tiny"
    figure = results / "figures/noise_alignment.png"
    figure.unlink()
    saved = {
        p: p.stat().st_mtime_ns
        for p in [results / "summary.csv", results / "manifest.json", *results.glob("states/*/*.json")]
    }
    redraw = _snakemake(workdir, "results/tiny/figures/noise_alignment.png")
    assert redraw.returncode == 0 and figure.exists()
    log = redraw.stdout + redraw.stderr
    assert re.search(r"^plot +1$", log, re.M) and "analyze_state" not in log and "rule collect" not in log
    assert all(p.stat().st_mtime_ns == t for p, t in saved.items())


def test_unknown_config_key_is_rejected(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"train_runs": {}, "colour": "blue"}))
    result = _snakemake(tmp_path, "-n")
    assert result.returncode != 0 and "colour" in result.stdout + result.stderr


def test_report_bundles_figures_summary_and_manifest(workdir):
    result = _snakemake(workdir, "--report", str(workdir / "report.html"))
    assert result.returncode == 0, result.stderr[-2000:]
    html = (workdir / "report.html").read_text(errors="replace")
    for name in ("summary.csv", "manifest.json", "normalized_alignment.pdf", "batch_sizes.pdf"):
        assert name in html


def test_lost_collected_files_are_restored(workdir):
    """A crash during collect leaves manifest.json and summary.csv missing or half replaced: both are
    targets, so a plain rerun collects again (from the saved results, nothing recomputed)."""
    results = workdir / "results/tiny"
    before = (results / "summary.csv").read_text()
    saved = {p: p.stat().st_mtime_ns for p in results.glob("states/*/*.json")}
    (results / "summary.csv").unlink()
    (results / "manifest.json").unlink()
    dry = _snakemake(workdir, "-n")
    assert re.search(r"^collect +1$", dry.stdout + dry.stderr, re.M), (dry.stdout + dry.stderr)[-2000:]
    assert _snakemake(workdir).returncode == 0
    assert (results / "summary.csv").read_text() == before and (results / "manifest.json").exists()
    assert all(p.stat().st_mtime_ns == t for p, t in saved.items() if p.name != "done.json")


def test_a_moved_project_recomputes_a_deleted_result(workdir, tmp_path):
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(workdir, moved, symlinks=True)
    _write_config(moved)  # the configuration names its own folder's run.yaml
    target = next((moved / "results/tiny/states").glob("*/seen.json"))
    expected = json.loads(target.read_text())["statistics"]
    target.unlink()
    # the threads the fixture computed with: another count sums in another order (the last bits)
    done = _snakemake(moved, *SAME_THREADS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(target.read_text())["statistics"] == expected


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"checkpoints": ["node-000/epoch-001.safetensors"]},
            "analyses.packed.checkpoints: node-000/epoch-001.safetensors is a worker checkpoint; list the root",
        ),
        ({"checkpoints": ["epoch-001.pt"]}, "analyses.packed.checkpoints: epoch-001.pt is not a root checkpoint"),
        (
            {"run": "elsewhere/run", "checkpoints": ["epoch-001.safetensors"]},
            "analyses.packed.checkpoints: epoch-001.safetensors does not exist in elsewhere/run",
        ),
        # read before the schema fills in case_steps' default, which would hide it
        ({"case_steps": 4}, "analyses.packed.case_steps: applies to an analysis with a training_order"),
    ],
)
def test_bad_checkpoint_lists_stop_with_the_config_key(tmp_path, change, message):
    _write_config(tmp_path)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["analyses"]["packed"].update(change)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = _snakemake(tmp_path, "-n")
    assert result.returncode != 0 and message in result.stdout + result.stderr, (result.stdout + result.stderr)[-2000:]
    assert not (tmp_path / "results").exists()


def _small_corpus(tmp_path, config):
    (tmp_path / "small.txt").write_text("too little text. " * 30)  # 510 bytes; training + unseen need ~770
    config["train_runs"]["tiny"].update(cache_source="text", cache_inputs=[str(tmp_path / "small.txt")])


def _no_cuda_device(tmp_path, config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    config["analyses"]["tiny"]["settings"]["device"] = "cuda"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t, c: c["analyses"]["tiny"]["settings"].update(noise_sample=3),
            "error: analyses.tiny.settings: unknown key 'noise_sample' (allowed: amp, audit,",
        ),
        (
            lambda t, c: c["analyses"]["tiny"]["settings"].update(noise_samples=-3),
            "error: analyses.tiny.settings.noise_samples: -3 is not valid",
        ),
        (
            lambda t, c: c["analyses"]["tiny"].update(checkpoints=["epoch-007.safetensors"]),
            "error: analyses.tiny.checkpoints: epoch-007.safetensors is not a checkpoint that training "
            "runs/tiny writes (epoch-000.safetensors, epoch-001.safetensors, epoch-002.safetensors, final.pt)",
        ),
        (
            _small_corpus,
            "error: train_runs.tiny.cache_inputs: the corpus holds about 448 bytes in whole sequences, but "
            "training and one unseen epoch at training.tokens=512 need about 768; add text to "
            "train_runs.tiny.cache_inputs, or lower training.tokens to at most 256 "
            "(train_runs.tiny.set: {training.tokens: 256})",
        ),
        (
            _no_cuda_device,
            "error: analyses.tiny.settings.device: cuda, but this machine has no CUDA device and the jobs "
            "run here; set analyses.tiny.settings.device to cpu or auto",
        ),
    ],
    ids=["unknown settings key", "bad value", "checkpoint training never writes", "corpus too small", "no such device"],
)
def test_start_up_refuses_with_one_line_naming_the_key(tmp_path, change, message):
    """Before any job: one line naming the config key, exit status 2, nothing written."""
    _write_config(tmp_path)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    change(tmp_path, config)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = _snakemake(tmp_path)  # a real run: the device is checked once the executor is known
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and errors == [errors[0]] and errors[0].startswith(message), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not any((tmp_path / folder).exists() for folder in ("results", "runs", "cache", "logs"))


def test_a_failed_job_ends_the_run_with_one_line_naming_config_keys(workdir, tmp_path):
    """A job that fails keeps its traceback in its log; the console ends with one line per failed
    job, its message and its log."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    _write_config(copy)
    shard = copy / "cache/tiny/shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    for result in (copy / "results/tiny/states").glob("*/seen.json"):
        result.unlink()
    done = _snakemake(copy)
    assert done.returncode != 0
    summary = done.stderr[done.stderr.index("job(s) failed:") :].splitlines()
    failed = [line for line in summary[1:] if line.startswith("  analyze_state results/tiny/states/")]
    assert len(failed) == len(list((copy / "results/tiny/states").iterdir())), done.stderr[-3000:]
    assert all(
        "cache shard cache/tiny/shard-00000.bin changed after preparation" in line and "[log: logs/" in line
        for line in failed
    )
    assert "Traceback" not in done.stderr
    log = failed[0].split("[log: ")[1].rstrip("]")
    assert "Traceback" in (copy / log).read_text()


def test_damaged_binding_is_named(workdir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    _write_config(copy)
    (copy / "results/tiny/identity.json").write_text("{half")
    result = _snakemake(copy, "-n")
    assert result.returncode != 0
    assert "results/tiny/identity.json is damaged" in result.stdout + result.stderr


def test_a_deleted_result_is_recomputed_alone_and_a_killed_collect_repaired(workdir):
    """A deleted result is planned alone (its state's spectra kept). The workflow that recomputes
    it is SIGKILLed while collect runs (Snakemake has already removed the old manifest.json and
    summary.csv): a plain rerun restores both, with the same contents, and nothing else is redone."""
    import signal
    import time

    results = workdir / "results/tiny"
    before = (results / "summary.csv").read_text()
    target = next(results.glob("states/*/unseen.json"))
    others = {p: p.stat().st_mtime_ns for p in results.glob("states/*/*.json") if p != target}
    target.unlink()
    dry = _snakemake(workdir, "-n")
    plan = dry.stdout + dry.stderr
    assert re.search(r"^analyze_state +1$", plan, re.M) and re.search(r"^finish_state +1$", plan, re.M), plan[-2000:]
    assert "analyze_spectrum" not in plan  # the state's spectra are kept
    collect_log = workdir / "logs/collect/tiny.log"
    collect_log.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(workdir / "config.yaml"),
            "-c2",
            *SAME_THREADS,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not collect_log.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert collect_log.exists(), "collect never started"
    assert target.exists()
    assert _snakemake(workdir, "--unlock").returncode == 0  # a SIGKILLed Snakemake leaves its lock (README)
    rerun = _snakemake(workdir, *SAME_THREADS)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (results / "summary.csv").read_text() == before and (results / "manifest.json").exists()
    assert all(p.stat().st_mtime_ns == t for p, t in others.items() if p.name != "done.json")
    dry = _snakemake(workdir, "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr
