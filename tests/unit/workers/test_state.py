"""The analysis worker end to end on tiny trained runs: result contract, packed consensus, reuse,
and every bad input refused before anything is written."""

import json
import shutil
from dataclasses import replace

import pytest
import torch
from builders import make_oracle_run, smallest_budget_gb
from oracles import dense_epoch_hessian
from safetensors.torch import load_file, save_file

from tiny_llm.cli import main
from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.checkpoint import load_weights
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import train
from tiny_llm.workers.resolution import memory_plan
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.state import analyze_state

FAST = AnalysisSettings(noise_samples=2, random_samples=3, device="cpu", dtype="float64", directions_per_pass=3)


def _record_reads(monkeypatch):
    read = []
    original = TokenCache.tokens
    monkeypatch.setattr(
        TokenCache, "tokens", lambda self, blocks: (read.append(list(blocks)), original(self, blocks))[1]
    )
    return read


@pytest.fixture(scope="module")
def ordinary(tmp_path_factory):
    path = tmp_path_factory.mktemp("ordinary")
    config = make_oracle_run(path)
    with pytest.MonkeyPatch.context() as mp:
        read = _record_reads(mp)
        train(config, path / "run")
    return config, path, read


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    path = tmp_path_factory.mktemp("packed")
    config = make_oracle_run(path, tokens=3 * 6 * 4 * 2, packed={"workers": 2, "sync_every": 3})
    with pytest.MonkeyPatch.context() as mp:
        read = _record_reads(mp)
        train(config, path / "run")
    return config, path, read


def _dense_hessian(config, state, plan):
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(state)
    tokens = torch.cat([TokenCache(config.data.cache).tokens(b) for b in plan.blocks])
    return dense_epoch_hessian(model, tokens), FlatParameters(model)


def test_result_contract_and_seen_batches(ordinary):
    config, path, read = ordinary
    out = path / "results" / "seen.json"
    result = analyze_state(path / "run", ["epoch-002.safetensors", "final.pt"], "seen", FAST, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert set(result) >= {
        "schema",
        "identity",
        "state",
        "case",
        "settings",
        "precision",
        "timing",
        "counts",
        "statistics",
        "noise_samples",
        "random_directions",
        "consensus",
    }
    assert [a["file"] for a in result["state"]["aliases"]] == ["epoch-002.safetensors", "final.pt"]
    assert result["state"]["aliases"][0]["step"] == config.total_batches and result["consensus"] is None
    assert set(result["statistics"]) == {
        "loss",
        "noise_curvature",
        "normalized_alignment",
        "mean_noise_norm",
        "mean_grad_norm",
        "full_grad_norm",
        "random_curvature",
        "grad_curvature",
        "b_simple",
        "b_noise",
        "gradient_sharpness",
        "gradient_step",
        "noise_gauss_newton",
        "random_gauss_newton",
        "grad_gauss_newton",
    }
    assert result["precision"]["dtype"] == "float64" and result["precision"]["quadratic_form_engine"] == "adjoint"
    assert set(result["timing"]["compile"]) == {"graphs", "seconds", "cache_hits", "cache_misses"}  # CPU: eager
    # Seen = exactly the batches training read in epoch 1.
    cache = TokenCache(config.data.cache)
    for record in result["noise_samples"]:
        blocks = read[record["batch_index"]]
        assert record["positions"] == [list(cache.position(b)) for b in blocks]
    # One statistic against the dense Hessian of the trained state.
    H, flat = _dense_hessian(config, load_file(path / "run" / "epoch-002.safetensors"), epoch_plan(config, 1))
    from tiny_llm.curvature.vectors import rademacher

    s = [rademacher(flat.D, 42, i) for i in range(3)]
    assert result["statistics"]["random_curvature"] == pytest.approx(
        float(sum(x @ H @ x for x in s)) / (3 * flat.D), rel=1e-9
    )


def test_rerun_reuses_and_changed_settings_are_refused(ordinary, monkeypatch):
    config, path, _ = ordinary
    out = path / "results" / "reuse.json"
    first = analyze_state(path / "run", ["epoch-001.safetensors"], "unseen", FAST, out)
    monkeypatch.setattr("tiny_llm.workers.state._measure", lambda *a, **k: pytest.fail("recomputed"))
    assert analyze_state(path / "run", ["epoch-001.safetensors"], "unseen", FAST, out) == first
    before = out.read_bytes()
    with pytest.raises(ValueError, match="holds a result with other settings, source or state; use a new output"):
        analyze_state(
            path / "run", ["epoch-001.safetensors"], "unseen", AnalysisSettings(**{**FAST.__dict__, "seed": 1}), out
        )
    with pytest.raises(ValueError, match="other settings, source or state"):
        analyze_state(path / "run", ["epoch-000.safetensors"], "unseen", FAST, out)
    assert out.read_bytes() == before


def test_packed_consensus_against_dense_oracle(packed):
    config, path, read = packed
    result = analyze_state(
        path / "run",
        ["epoch-001.safetensors"],
        "seen",
        AnalysisSettings(**{**FAST.__dict__, "noise_samples": None}),
        path / "out.json",
    )
    root = load_file(path / "run" / "epoch-001.safetensors")
    H, flat = _dense_hessian(config, root, epoch_plan(config, 1))
    x_bar = flat.flatten_state(root).double()
    records = result["consensus"]["workers"]
    q = []
    for w, record in enumerate(records):
        e = flat.flatten_state(load_file(path / "run" / f"node-{w:03d}" / "epoch-001.safetensors")).double() - x_bar
        q.append(float(e @ H @ e))
        assert record["worker"] == w and record["curvature"] == pytest.approx(q[-1], rel=1e-9, abs=1e-12)
        assert record["squared_norm"] == pytest.approx(float(e @ e), rel=1e-12) and record["squared_norm"] > 0
    assert result["consensus"]["aggregate"]["mean_curvature"] == pytest.approx(sum(q) / 2, rel=1e-9, abs=1e-12)
    assert result["state"]["key"] != result["state"]["weights_hash"] and len(result["state"]["worker_hashes"]) == 2
    # Every batch of epoch 1, each attributed to the worker that trained on it.
    assert sorted(r["batch_index"] for r in result["noise_samples"]) == list(range(4))
    cache = TokenCache(config.data.cache)
    for record in result["noise_samples"]:
        assert record["worker"] == record["stream_batch"] % 2
        assert record["positions"] == [list(cache.position(b)) for b in read[record["stream_batch"]]]
    without = analyze_state(
        path / "run",
        ["epoch-001.safetensors"],
        "seen",
        AnalysisSettings(**{**FAST.__dict__, "consensus": False}),
        path / "plain.json",
    )
    assert without["consensus"] is None and without["state"]["key"] == without["state"]["weights_hash"]


def test_initial_packed_state_has_zero_consensus(packed):
    config, path, _ = packed
    result = analyze_state(path / "run", ["epoch-000.safetensors"], "seen", FAST, path / "zero.json")
    assert [w["curvature"] for w in result["consensus"]["workers"]] == [0.0, 0.0]
    assert result["consensus"]["aggregate"]["normalized_alignment"] is None


def _assert_refused(path, run, checkpoints, message, settings=FAST, case="seen"):
    out = path / "refused" / "result.json"
    with pytest.raises(ValueError, match=message):
        analyze_state(run, checkpoints, case, settings, out)
    assert not out.exists()


def test_bad_checkpoints_are_refused(ordinary, tmp_path):
    config, path, _ = ordinary
    run = tmp_path / "run"
    shutil.copytree(path / "run", run)
    _assert_refused(tmp_path, run, ["epoch-007.safetensors"], "does not exist")
    _assert_refused(tmp_path, run, ["resolved.yaml"], "expected a root checkpoint")
    _assert_refused(tmp_path, run, [str(path / "run" / "final.pt")], "expected a root checkpoint of")
    (run / "epoch-005.safetensors").write_bytes((run / "epoch-001.safetensors").read_bytes()[:-50])
    _assert_refused(tmp_path, run, ["epoch-005.safetensors"], "is truncated or corrupt")
    state = load_file(run / "epoch-001.safetensors")
    save_file(
        {**state, "norm.weight": torch.full_like(state["norm.weight"], float("nan"))}, run / "epoch-006.safetensors"
    )
    _assert_refused(tmp_path, run, ["epoch-006.safetensors"], "norm.weight: 8 non-finite values")
    save_file(
        {k: v for k, v in state.items() if k != "norm.weight"} | {"norm.bias": torch.zeros(8)},
        run / "epoch-008.safetensors",
    )
    _assert_refused(
        tmp_path,
        run,
        ["epoch-008.safetensors"],
        r"missing tensors \['norm.weight'\]; unexpected tensors \['norm.bias'\]",
    )
    save_file({**state, "tok_embeddings.weight": torch.zeros(17, 8)}, run / "epoch-009.safetensors")
    _assert_refused(
        tmp_path, run, ["epoch-009.safetensors"], r"tok_embeddings.weight: shape \(17, 8\), expected \(16, 8\)"
    )
    _assert_refused(
        tmp_path, run, ["epoch-001.safetensors", "epoch-002.safetensors"], "hold different parameter states"
    )
    with pytest.raises(ValueError, match="--amp requires --dtype float32"):
        AnalysisSettings(amp=True, dtype="float64")


def test_packed_worker_problems_are_refused(packed, tmp_path):
    config, path, _ = packed
    run = tmp_path / "run"
    shutil.copytree(path / "run", run)
    _assert_refused(tmp_path, run, ["node-001/epoch-001.safetensors"], "is a worker checkpoint; analyse the root")
    (run / "node-001" / "epoch-002.safetensors").unlink()
    _assert_refused(
        tmp_path, run, ["epoch-002.safetensors"], r"lacks worker files .*node-001/epoch-002.safetensors.*--no-consensus"
    )
    shutil.copy(run / "node-000" / "epoch-000.safetensors", run / "node-001" / "epoch-001.safetensors")
    _assert_refused(tmp_path, run, ["epoch-001.safetensors"], "differ from the workers' float32 average")
    out = tmp_path / "ok.json"
    analyze_state(
        run, ["epoch-002.safetensors"], "seen", AnalysisSettings(**{**FAST.__dict__, "consensus": False}), out
    )
    assert out.exists()


def test_cache_too_small_for_unseen(ordinary, tmp_path):
    config, path, _ = ordinary
    run = tmp_path / "run"
    shutil.copytree(path / "run", run)
    small = tmp_path / "small"
    shutil.copytree(path / "cache", small)
    meta = json.loads((small / "meta.json").read_text())
    shard = meta["shards"][-1]
    meta["shards"] = meta["shards"][:-1]  # drop the last shard: training still fits, unseen does not
    (small / "meta.json").write_text(json.dumps(meta))
    (run / "resolved.yaml").write_text((run / "resolved.yaml").read_text().replace(str(path / "cache"), str(small)))
    _assert_refused(
        tmp_path,
        run,
        ["epoch-001.safetensors"],
        r"prepare a new cache with data.prepare_train_tokens=\d+",
        case="unseen",
    )
    assert not (small / shard["file"]).read_bytes() == b""  # the shard is still there, just not listed


def test_lock_prevents_a_second_writer(ordinary, tmp_path):
    import fcntl

    config, path, _ = ordinary
    out = tmp_path / "locked.json"
    with open(tmp_path / ".locked.json.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match=r"another process \(pid unknown\) is writing .*wait for it to finish"):
            analyze_state(path / "run", ["epoch-001.safetensors"], "seen", FAST, out)
    assert not out.exists()
    analyze_state(path / "run", ["epoch-001.safetensors"], "seen", FAST, out)  # lock released: it runs
    assert out.exists() and not (tmp_path / ".locked.json.lock").exists()  # and leaves no lock file behind


def test_cli_options(ordinary, tmp_path, capsys):
    config, path, _ = ordinary
    out = tmp_path / "cli.json"
    args = [
        "--quiet",
        "analyze-state",
        "--run",
        str(path / "run"),
        "--checkpoint",
        "epoch-001.safetensors",
        "--case",
        "unseen",
        "--output",
        str(out),
        "--device",
        "cpu",
        "--dtype",
        "float64",
        "--noise-samples",
        "all",
        "--random-samples",
        "2",
        "--engine",
        "pearlmutter",
        "--hvp-batch-size",
        "5",
    ]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["counts"]["noise_samples"] == config.steps_per_epoch and result["counts"]["hvp_batch_size"] == 5
    assert result["precision"]["engine"] == "pearlmutter" and result["case"] == "unseen"
    assert result["settings"]["noise_samples"] == "all"  # as a configuration writes it
    with pytest.raises(SystemExit) as error:
        main(args + ["--colour", "blue"])
    assert error.value.code == 2 and "unrecognized arguments: --colour" in capsys.readouterr().err
    assert (
        main(
            [
                "analyze-state",
                "--run",
                str(path / "run"),
                "--checkpoint",
                "epoch-001.safetensors",
                "--case",
                "seen",
                "--output",
                str(tmp_path / "amp.json"),
                "--amp",
                "--dtype",
                "float64",
            ]
        )
        == 2
    )
    assert "--amp requires --dtype float32" in capsys.readouterr().err and not (tmp_path / "amp.json").exists()
    with pytest.raises(SystemExit):
        main(args[:-2] + ["--noise-samples", "0"])


def test_sampled_gradient_replays_training_accumulation(ordinary):
    """Step 1 of training (float32, reference attention, micro-batches 2 + 1) logged the loss and the
    pre-clipping norm of exactly the gradient analysis computes for seen batch 0 at epoch-000."""
    from tiny_llm.curvature.gradients import batch_gradient
    from tiny_llm.curvature.hessian import Precision

    config, path, _ = ordinary
    assert config.training.batch_size % config.training.micro_batch_size  # a remainder micro-batch
    model = Llama(config.model, attention_backend="reference")
    model.load_state_dict(load_file(path / "run" / "epoch-000.safetensors"))
    tokens = TokenCache(config.data.cache).tokens(epoch_plan(config, 1).blocks[0])
    g = batch_gradient(
        model,
        FlatParameters(model),
        tokens,
        config.training.micro_batch_size,
        Precision(torch.device("cpu"), torch.float32),
    )
    first = json.loads((path / "run" / "train-log.jsonl").read_text().splitlines()[0])
    assert first["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-6)


def test_cuda_request_without_gpu_is_a_clear_error(ordinary, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    config, path, _ = ordinary
    _assert_refused(
        tmp_path,
        path / "run",
        ["epoch-001.safetensors"],
        "no CUDA device is available here; use --device cpu",
        settings=AnalysisSettings(device="cuda"),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("engine", ["auto", "pearlmutter"])
@pytest.mark.parametrize("amp", [False, True])
def test_cuda_float32_agrees_with_cpu_float64(ordinary, tmp_path, engine, amp):
    """The cluster paths (adjoint quadratic forms, and compiled Pearlmutter; TF32, optionally bf16
    autocast) against the CPU float64 reference, and the matmul precision restored afterwards."""
    config, path, _ = ordinary
    before = torch.backends.cuda.matmul.fp32_precision
    reference = analyze_state(path / "run", ["epoch-002.safetensors"], "seen", FAST, tmp_path / "cpu.json")
    settings = AnalysisSettings(
        **{**FAST.__dict__, "device": "cuda", "dtype": "float32", "amp": amp, "engine": engine, "compile_hvp": True}
    )
    gpu = analyze_state(
        path / "run", ["epoch-002.safetensors"], "seen", settings, tmp_path / f"gpu-{engine}-{amp}.json"
    )
    assert gpu["precision"]["quadratic_form_engine"] == ("adjoint" if engine == "auto" else "pearlmutter")
    if engine == "pearlmutter":
        assert gpu["timing"]["compile"]["graphs"] >= 1  # it really ran compiled
    assert torch.backends.cuda.matmul.fp32_precision == before
    tolerance = 0.1 if amp else 1e-2
    for key in ("random_curvature", "grad_curvature", "full_grad_norm", "mean_grad_norm"):
        assert gpu["statistics"][key] == pytest.approx(reference["statistics"][key], rel=tolerance, abs=1e-6)


def test_out_of_memory_names_the_settings_to_lower_and_writes_nothing(ordinary, tmp_path, monkeypatch):
    config, path, _ = ordinary

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("tiny_llm.workers.state.measure_case", out_of_memory)
    out = tmp_path / "oom.json"
    with pytest.raises(
        ValueError,
        match=r"out of memory with --hvp-batch-size \d+ and --directions-per-pass "
        rf"{FAST.directions_per_pass} .*smaller memory_budget_gb",
    ):
        analyze_state(path / "run", ["epoch-001.safetensors"], "seen", FAST, out)
    assert not out.exists() and not list(tmp_path.glob(".oom*"))


def test_a_memory_budget_cuts_every_pass_without_changing_a_number(ordinary, tmp_path):
    """A budget that forces one sequence per group in every pass (gradients, forms, audit) gives
    the statistics of the unchunked job to 1e-12 in float64, records the grouping, and is not part of
    the result's identity (the unchunked result is reused under any budget)."""
    config, path, _ = ordinary
    settings = AnalysisSettings(
        noise_samples=2, random_samples=3, device="cpu", dtype="float64", directions_per_pass=3, audit=True
    )
    whole = analyze_state(path / "run", ["epoch-001.safetensors"], "seen", settings, tmp_path / "whole.json")
    high = smallest_budget_gb(lambda gb: memory_plan(settings, config, int(gb * 2**30), cuda=False))
    budget = replace(settings, memory_budget_gb=high)
    cut = analyze_state(path / "run", ["epoch-001.safetensors"], "seen", budget, tmp_path / "cut.json")
    groups = {p["name"]: p["group_rows"] for p in cut["memory"]["passes"]}
    assert min(groups.values()) == 1 and cut["memory"]["predicted_peak_bytes"] <= cut["memory"]["budget_bytes"]
    assert cut["identity"] == whole["identity"]
    for name, value in whole["statistics"].items():
        assert cut["statistics"][name] == (None if value is None else pytest.approx(value, rel=1e-12, abs=1e-300)), name
    for a, b in zip(cut["audit"]["directions"], whole["audit"]["directions"], strict=True):
        assert a["float64"] == pytest.approx(b["float64"], rel=1e-12)
    again = analyze_state(path / "run", ["epoch-001.safetensors"], "seen", budget, tmp_path / "whole.json")
    assert again == whole  # reused: the budget changes how the work is cut, not the result


def test_a_budget_below_one_sequence_is_refused_before_any_work(ordinary, tmp_path, capsys):
    _, path, _ = ordinary
    out = tmp_path / "tiny.json"
    assert (
        main(
            [
                "analyze-state",
                "--run",
                str(path / "run"),
                "--checkpoint",
                "epoch-001.safetensors",
                "--case",
                "seen",
                "--output",
                str(out),
                "--device",
                "cpu",
                "--dtype",
                "float64",
                "--memory-budget-gb",
                "1e-6",
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert "gradient: one sequence of 6 tokens needs" in error and "more than memory_budget_gb = 1.05 KiB" in error
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_gpt2_run_trains_resumes_and_is_analysed(tmp_path):
    """model.architecture: gpt2 end to end below the workflow: training resumes bit-identically,
    the checkpoints load, and every engine gives the same statistics (float64, 1e-10)."""
    config = make_oracle_run(tmp_path, model={"architecture": "gpt2"}, epochs=3, tokens=3 * 6 * 3 * 3)
    train(config, tmp_path / "full")
    train(config, tmp_path / "split", stop_after_epoch=1)
    train(config, tmp_path / "split")
    full, split = (load_weights(tmp_path / run / "final.pt")[0] for run in ("full", "split"))
    assert full.keys() == split.keys() and all(torch.equal(full[k], split[k]) for k in full)
    assert "pos_embeddings.weight" in full and "layers.0.attention.wqkv.bias" in full
    results = {
        engine: analyze_state(
            tmp_path / "full",
            ["epoch-002.safetensors"],
            "seen",
            replace(FAST, engine=engine),
            tmp_path / f"{engine}.json",
        )
        for engine in ("adjoint", "taylor", "double_backward", "finite_difference")
    }
    reference = results["double_backward"]["statistics"]
    # the step regime of finite-difference forms is recorded (1e-6 in float64), and only for them
    assert results["finite_difference"]["precision"]["finite_difference_scale"] == 1e-6
    assert "finite_difference_scale" not in results["taylor"]["precision"]
    for key, value in reference.items():
        assert results["finite_difference"]["statistics"][key] == (
            None if value is None else pytest.approx(value, rel=1e-6, abs=1e-9)
        ), key
    for engine in ("adjoint", "taylor"):
        for key, value in reference.items():
            if value is not None:
                assert results[engine]["statistics"][key] == pytest.approx(value, rel=1e-10, abs=1e-12), (engine, key)
    assert results["adjoint"]["statistics"]["noise_gauss_newton"] is not None


def test_the_step_case_measures_the_step_on_the_batches_it_trained_on(ordinary):
    """From epoch-001 to epoch-002: the step case reads exactly the batches training read between
    them (recorded as it trained), and ḡᵀΔ, ΔᵀHΔ and L(θ') − L(θ) on them equal the dense float64
    oracle's; without a successor (the last state) it reads the unseen case's batches."""
    config, path, read = ordinary
    S = config.steps_per_epoch
    successor = {"key": "next", "file": "epoch-002.safetensors", "step": 2 * S}
    out = path / "results" / "step.json"
    result = analyze_state(path / "run", ["epoch-001.safetensors"], "step", FAST, out, successor=successor)
    assert result["data"]["plan"] == f"steps {S + 1}..{2 * S}" and result["data"]["stream_batches"] == [S, 2 * S - 1]
    cache = TokenCache(config.data.cache)
    for record in result["noise_samples"]:
        assert record["positions"] == [list(cache.position(b)) for b in read[S + record["batch_index"]]]
    theta, following = (load_file(path / "run" / f"epoch-00{e}.safetensors") for e in (1, 2))
    H, flat = _dense_hessian(config, theta, epoch_plan(config, 2))
    delta = flat.flatten_state({k: following[k].double() - theta[k].double() for k in theta})
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(theta)
    tokens = torch.cat([cache.tokens(b) for b in epoch_plan(config, 2).blocks])
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    g = flat.flatten([p.grad for p in model.parameters()])
    model.load_state_dict(following)
    with torch.no_grad():
        after = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    statistics = result["statistics"]
    assert statistics["step_curvature"] == pytest.approx(float(delta @ H @ delta), rel=1e-9)
    assert statistics["step_grad_dot"] == pytest.approx(float(g @ delta), rel=1e-9)
    assert statistics["actual_loss_change"] == pytest.approx(float(after - loss), rel=1e-9)
    last = analyze_state(path / "run", ["final.pt"], "step", FAST, path / "results" / "last-step.json")
    assert last["data"]["plan"] == "unseen" and last["statistics"].get("step_curvature") is None
