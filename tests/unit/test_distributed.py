"""Data-parallel passes: 2 and 3 CPU ranks (gloo, a file rendezvous) give the single-process
quadratic forms, Hessian-vector products, Gauss–Newton split, mean gradient and loss in float64
(an uneven number of micro-batches and a padded last one included), and a whole analysis whose
result one rank writes; torchrun runs the command line unchanged."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from builders import make_oracle_run
from oracles import TINY_MODEL

from tiny_llm.curvature.gradients import mean_gradient_and_loss
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.distributed import is_writer, rank_note, shard, single_writer, world
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import train
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.spectrum import SpectrumSettings, analyze_spectrum
from tiny_llm.workers.state import analyze_state

CPU64 = Precision(torch.device("cpu"), torch.float64)
SETTINGS = AnalysisSettings(
    noise_samples=3, random_samples=4, device="cpu", dtype="float64", directions_per_pass=3, hvp_batch_size=2
)
"""5 batches of 3 sequences, curvature micro-batches of 2: 8 micro-batches, the last padded."""


def _measure() -> dict[str, torch.Tensor]:
    """Every reduced quantity on the float64 TINY_MODEL: 7 sequences in micro-batches of 3 (the last
    padded), 5 directions in passes of 2."""
    torch.manual_seed(0)
    model = Llama(TINY_MODEL, attention_backend="reference").double()
    tokens = torch.randint(0, 16, (7, 7), generator=torch.Generator().manual_seed(2))
    V = torch.randn(5, FlatParameters(model).D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = {}
    for engine in ("adjoint", "double_backward"):
        op = EpochHessian(model, tokens, batch_size=3, engine=engine, precision=CPU64, directions_per_pass=2)
        out[f"{engine} forms"] = op.quadratic_forms(V)
    out["split"] = EpochHessian(
        model, tokens, batch_size=3, engine="taylor", precision=CPU64, directions_per_pass=2
    ).split_quadratic_forms(V)
    out["hvp"] = EpochHessian(
        model, tokens, batch_size=3, engine="pearlmutter", precision=CPU64, directions_per_pass=2
    ).hvp(V)
    batches = [tokens[i : i + 2] for i in range(0, 7, 2)]  # 4 batches, the last of 1 sequence
    g, loss = mean_gradient_and_loss(model, FlatParameters(model), batches, 2, CPU64)
    out["gradient"], out["loss"] = g, torch.tensor(loss, dtype=torch.float64)
    return out


def _rank(rank: int, size: int, store: str, results: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        assert world() == (rank, size) and is_writer() == (rank == 0)
        assert shard(list(range(7))) == list(range(rank, 7, size))
        torch.save(_measure(), f"{results}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [3])  # 2 ranks: the analysis and torchrun tests below
def test_ranks_give_the_single_process_numbers(tmp_path, ranks):
    single = _measure()
    assert world() == (0, 1) and is_writer()
    mp.start_processes(
        _rank, args=(ranks, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=ranks, start_method="spawn"
    )
    for rank in range(ranks):  # every rank holds the same numbers
        parallel = torch.load(tmp_path / f"out.{rank}", weights_only=True)
        for name, value in single.items():
            scale = float(value.abs().max())
            assert float((parallel[name] - value).abs().max()) <= 1e-12 * scale, (name, rank)


def _analyze(rank: int, size: int, store: str, run: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        result = analyze_state(run, ["epoch-001.safetensors"], "seen", SETTINGS, out, successor=NEXT)
        torch.save(
            {
                "statistics": result["statistics"],
                "standard_errors": result["standard_errors"],
                "noise": [r["noise_curvature"] for r in result["noise_samples"]],
                "parallel": result["parallel"],
            },
            f"{out}.{rank}",
        )
    finally:
        dist.destroy_process_group()


NEXT = {"file": "epoch-002.safetensors"}
"""The successor of the analysed state (epoch-001): the statistics along the step to it, and its
share in the top eigenspace."""


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp")
    train(make_oracle_run(path, tokens=3 * 6 * 5 * 2), path / "run")  # 5 batches per epoch
    return path


@pytest.mark.parametrize("ranks", [2, 3])
def test_an_analysis_on_ranks_gives_the_single_process_result_written_once(oracle_run, tmp_path, ranks):
    """analyze_state on 2 and 3 ranks: every statistic (the step to the next checkpoint's
    included), standard error and noise sample of the single-process result to 1e-12 on every
    rank; rank 0 writes it, with the rank count recorded outside the identity (which is the single
    process's)."""
    single = analyze_state(
        oracle_run / "run", ["epoch-001.safetensors"], "seen", SETTINGS, tmp_path / "single.json", successor=NEXT
    )
    assert single["statistics"]["step_curvature"] is not None
    assert single["parallel"] == {"ranks": 1, "backend": None, "sharded": False}
    out = tmp_path / "parallel.json"
    mp.start_processes(
        _analyze,
        args=(ranks, str(tmp_path / "store"), str(oracle_run / "run"), str(out)),
        nprocs=ranks,
        start_method="spawn",
    )
    written = json.loads(out.read_text())
    assert written["parallel"] == {"ranks": ranks, "backend": "gloo", "sharded": False}
    assert written["identity"] == single["identity"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("parallel.json")) == [
        "parallel.json",
        *(f"parallel.json.{r}" for r in range(ranks)),
    ]  # one result file, no leftovers
    for rank in range(ranks):
        got = torch.load(f"{out}.{rank}", weights_only=False)
        for block in ("statistics", "standard_errors"):
            for name, value in single[block].items():
                if value is None:
                    assert got[block][name] is None, name
                else:
                    assert got[block][name] == pytest.approx(value, rel=1e-12, abs=1e-15), (block, name, rank)
        assert got["noise"] == pytest.approx([r["noise_curvature"] for r in single["noise_samples"]], rel=1e-12)


def test_torchrun_and_srun_run_the_command_line_unchanged(oracle_run, tmp_path):
    """tiny-llm analyze-state under torchrun --nproc-per-node 2 (CPU, gloo), and as two tasks the way
    srun starts them (Slurm's variables only): the single-process statistics, printed once."""
    single = analyze_state(
        oracle_run / "run", ["epoch-001.safetensors"], "seen", SETTINGS, tmp_path / "single.json", successor=NEXT
    )
    assert single["statistics"]["step_curvature"] is not None
    arguments = [
        "--quiet",
        "analyze-state",
        "--run",
        str(oracle_run / "run"),
        "--checkpoint",
        "epoch-001.safetensors",
        "--successor",
        "epoch-002.safetensors",
        "--case",
        "seen",
        "--device",
        "cpu",
        "--dtype",
        "float64",
        "--noise-samples",
        "3",
        "--random-samples",
        "4",
        "--directions-per-pass",
        "3",
        "--hvp-batch-size",
        "2",
    ]
    torchrun = Path(sys.executable).with_name("torchrun")
    # "--" ends torchrun's options: its own --run-path would otherwise claim --run.
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "tiny_llm.cli",
            "--",
            *arguments,
            "--output",
            str(tmp_path / "torchrun.json"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count('"b_noise"') == 1
    refused = subprocess.run(  # a refusal on every rank: one whole line each, never joined
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "tiny_llm.cli", "--", *arguments]
        + ["--successor", "epoch-001.safetensors", "--output", str(tmp_path / "refused.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in refused.stderr.splitlines() if "tiny-llm analyze-state: error" in line]
    assert refused.returncode != 0 and not (tmp_path / "refused.json").exists()
    assert {line.partition("error")[2][:15] for line in lines} == {" (rank 0 of 2):", " (rank 1 of 2):"}, lines
    assert all(
        line.count("tiny-llm analyze-state") == 1 and line.endswith("name the next checkpoint") for line in lines
    )
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "tiny_llm.cli", *arguments, "--output", str(tmp_path / "srun.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **clean,
                "OMP_NUM_THREADS": "1",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_PROCID": str(task),
                "SLURM_LOCALID": str(task),
                "SLURM_JOB_NODELIST": "localhost",
                "SLURM_JOB_ID": str(os.getpid()),
            },
        )
        for task in range(2)
    ]
    outputs = [task.communicate(timeout=300) for task in tasks]
    assert all(task.returncode == 0 for task in tasks), outputs[0][1][-3000:] + outputs[1][1][-3000:]
    assert sum(out.count('"b_noise"') for out, _ in outputs) == 1
    for name in ("torchrun.json", "srun.json"):
        written = json.loads((tmp_path / name).read_text())
        assert written["parallel"]["ranks"] == 2 and written["parallel"]["backend"] == "gloo", name
        for key, value in single["statistics"].items():
            assert written["statistics"][key] == (None if value is None else pytest.approx(value, rel=1e-12)), key


SPECTRUM = SpectrumSettings(top_k=2, lanczos_steps=12, slq_vectors=1, slq_steps=5, block_samples=1, cg_max_iterations=5)
FD = replace(SETTINGS, engine="finite_difference")


def _spectrum(rank: int, size: int, store: str, run: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        result = analyze_spectrum(run, ["epoch-001.safetensors"], "seen", FD, SPECTRUM, out, None, NEXT)
        torch.save(json.loads(json.dumps(result)), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _spectral_numbers(result: dict) -> list[float]:
    """Every number of a spectrum result that the ranks compute (the run kept its Adam moments, so
    the preconditioned top eigenvalues too)."""
    numbers = [p["eigenvalue"] for p in result["top_eigenvalues"] + result["top_magnitude_eigenvalues"]]
    numbers += [v for nodes in result["slq"]["nodes"] for v in nodes] + [result["slq"]["trace_over_D"]]
    alignment = result["alignment"]
    numbers += alignment["gradient_top"] + alignment["noise_top_mean"] + alignment["step_top"]
    numbers += [alignment["gradient_top_share"], alignment["step_top_share"]]
    numbers += [result["cg"]["g_inverse_g"], result["cg"]["relative_residual"]]
    numbers += [p["eigenvalue"] for p in result["preconditioned"]["top_eigenvalues"]]  # those of P^{1/2}HP^{1/2}
    return numbers + [x for kind in result["block_diagonal"].values() for x in kind["relative_error"] + kind["cosine"]]


def test_a_spectrum_on_ranks_data_parallel_and_sharded(oracle_run, tmp_path):
    """analyze_spectrum on 2 ranks with every parameter on each (data-parallel products), then under
    torchrun with the model and vectors sharded (FSDP2, shard-local finite differences): every
    spectral number of the single-process finite-difference result (the step to the next
    checkpoint's top-eigenspace share included), one result file each."""
    single = analyze_spectrum(
        oracle_run / "run", ["epoch-001.safetensors"], "seen", FD, SPECTRUM, tmp_path / "single.json", None, NEXT
    )
    assert single["parallel"] == {"ranks": 1, "backend": None, "sharded": False}
    out = tmp_path / "parallel.json"
    mp.start_processes(
        _spectrum, args=(2, str(tmp_path / "store"), str(oracle_run / "run"), str(out)), nprocs=2, start_method="spawn"
    )
    written = json.loads(out.read_text())
    assert written["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": False}
    assert written["identity"] == single["identity"]
    for rank in range(2):
        assert _spectral_numbers(torch.load(f"{out}.{rank}", weights_only=False)) == pytest.approx(
            _spectral_numbers(single), rel=1e-12, abs=1e-14
        )

    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "tiny_llm.cli",
            "--",
            "--quiet",
            "analyze-spectrum",
            "--sharded",
            "--run",
            str(oracle_run / "run"),
            "--checkpoint",
            "epoch-001.safetensors",
            "--successor",
            "epoch-002.safetensors",
            "--case",
            "seen",
            "--output",
            str(tmp_path / "sharded.json"),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--engine",
            "finite_difference",
            "--noise-samples",
            "3",
            "--directions-per-pass",
            "3",
            "--hvp-batch-size",
            "2",
            "--top-k",
            "2",
            "--lanczos-steps",
            "12",
            "--slq-vectors",
            "1",
            "--slq-steps",
            "5",
            "--block-samples",
            "1",
            "--cg-max-iterations",
            "5",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sharded = json.loads((tmp_path / "sharded.json").read_text())
    assert sharded["parallel"] == {"ranks": 2, "backend": "gloo", "sharded": True}
    assert (
        sharded["precision"]["engine"] == "finite_difference"
        and sharded["precision"]["finite_difference_scale"] == 1e-6
    )
    assert done.stdout.count('"top_eigenvalues"') == 1
    assert _spectral_numbers(sharded) == pytest.approx(_spectral_numbers(single), rel=1e-7, abs=1e-9)


def test_a_sharded_spectrum_refuses_another_product_engine(oracle_run, tmp_path):
    with pytest.raises(
        ValueError,
        match="spectrum.sharded: the products engines that run on a sharded model are finite_difference; "
        "set engine to one of them or auto, not double_backward",
    ):
        analyze_spectrum(
            oracle_run / "run",
            ["epoch-002.safetensors"],
            "seen",
            replace(SETTINGS, engine="double_backward"),
            replace(SPECTRUM, sharded=True),
            tmp_path / "out.json",
        )
    assert not (tmp_path / "out.json").exists()


def test_a_job_on_ranks_logs_rank_zero_progress_once_and_ends_with_a_ranks_refusal(oracle_run, tmp_path, capfd):
    """run_on_ranks (what a gpus_per_job job calls): rank 0's progress lines reach the job's log,
    each once; a rank's refusal is raised as its own one line, after the launcher's report."""
    from tiny_llm.workers.ranks import run_on_ranks
    from tiny_llm.workers.settings import settings_record

    arguments = {
        "run_dir": str(oracle_run / "run"),
        "checkpoints": ["epoch-002.safetensors"],
        "case": "seen",
        "settings": settings_record(SETTINGS),
    }
    result = run_on_ranks("analyze_state", {**arguments, "expect_key": None}, tmp_path / "r.json", ranks=2)
    log = capfd.readouterr().err
    label = f"[{result['state']['key'][:12]} seen]"
    lines = [line.split(": ", 1)[1] for line in log.splitlines() if label in line]
    assert lines and len(lines) == len(set(lines)), log[-2000:]
    with pytest.raises(ValueError, match=r"^checkpoints \['epoch-002.safetensors'\] hash to state key"):
        run_on_ranks("analyze_state", {**arguments, "expect_key": "0" * 64}, tmp_path / "refused.json", ranks=2)
    assert not (tmp_path / "refused.json").exists()


def test_the_one_writer_clears_leftovers_and_shares_its_decision(tmp_path):
    output = tmp_path / "seen.json"
    leftover = tmp_path / ".seen.json.x1y2.tmp"  # what a killed atomic write leaves
    leftover.write_text("half")
    with single_writer(output) as writer:
        assert not leftover.exists()  # a killed write's temporary file, cleared under the lock
        assert writer.reuse(lambda: "decided") == "decided"  # one process: its own decision
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], [".seen.json.lock"])  # nothing else left


def test_a_refusal_names_its_rank_only_among_several(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rank_note() == " (rank 1 of 3)"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert rank_note() == ""
