"""Training: determinism, resume, checkpoints, packed averaging, logs, accumulation with remainders."""

import io
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.causal import token_losses
from tiny_llm.model.checkpoint import load_train_state, load_weights
from tiny_llm.model.llama import Llama
from tiny_llm.model.moments import load_into, load_moments
from tiny_llm.training.loop import _Trainer, accumulate_batch_gradient, train


def _weights(path):
    return load_weights(path)[0]


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_training_is_deterministic(make_config, tmp_path):
    config = make_config()
    train(config, tmp_path / "a")
    train(config, tmp_path / "b")
    for name in ("epoch-001.safetensors", "epoch-002.safetensors", "final.pt"):
        assert _equal(_weights(tmp_path / "a" / name), _weights(tmp_path / "b" / name))
    assert (tmp_path / "a" / "train-log.jsonl").read_text().count("\n") == config.total_batches
    assert not _equal(_weights(tmp_path / "a" / "epoch-000.safetensors"), _weights(tmp_path / "a" / "final.pt"))


def test_resume_continues_bit_identically(make_config, tmp_path):
    config = make_config(epochs=3, tokens=4 * 8 * 3 * 3)
    train(config, tmp_path / "full")
    train(config, tmp_path / "split", stop_after_epoch=1)
    assert (tmp_path / "split" / "resume.pt").exists() and not (tmp_path / "split" / "final.pt").exists()
    train(config, tmp_path / "split")
    assert not (tmp_path / "split" / "resume.pt").exists()
    full, split = load_train_state(tmp_path / "full" / "final.pt"), load_train_state(tmp_path / "split" / "final.pt")
    assert _equal(full["model"], split["model"])
    assert _equal(full["workers"][0]["optimizer"]["state"][0], split["workers"][0]["optimizer"]["state"][0])
    logs = [(tmp_path / d / "train-log.jsonl").read_text() for d in ("full", "split")]
    assert logs[0] == logs[1]
    train(config, tmp_path / "split")  # finished: a no-op
    assert (tmp_path / "split" / "train-log.jsonl").read_text() == logs[0]


def test_changed_setting_refuses_to_resume(make_config, tmp_path):
    config = make_config()
    train(config, tmp_path / "run", stop_after_epoch=1)
    changed = make_config(lr=1e-4)
    with pytest.raises(ValueError, match=r"other settings \(training.lr: 0.003 -> 0.0001\)"):
        train(changed, tmp_path / "run")
    assert make_config(log_every=5).training.log_every == 5
    train(make_config(log_every=5), tmp_path / "run")  # not a scientific setting
    assert (tmp_path / "run" / "final.pt").exists()


def test_interval_checkpoints_and_metadata(make_config, tmp_path):
    config = make_config()
    train(config, tmp_path / "run")
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert names == [
        "epoch-000.safetensors",
        "epoch-001.safetensors",
        "epoch-002.safetensors",
        "final.pt",
        "moments-001.safetensors",  # the optimizer's moments (keep_moments), none at the initialisation
        "moments-002.safetensors",
        "resolved.yaml",
        "train-log.jsonl",
    ]
    _, meta = load_weights(tmp_path / "run" / "epoch-001.safetensors")
    S = config.steps_per_epoch
    assert meta["step"] == str(S) and meta["tokens"] == str(S * config.batch_tokens) and meta["epoch"] == "1"
    assert _equal(_weights(tmp_path / "run" / "epoch-002.safetensors"), _weights(tmp_path / "run" / "final.pt"))
    train(make_config(checkpoint_policy="final"), tmp_path / "final-only")
    assert sorted(p.name for p in (tmp_path / "final-only").iterdir()) == [
        "final.pt",
        "resolved.yaml",
        "train-log.jsonl",
    ]


def test_seen_epoch_is_what_training_read(make_config, tmp_path, monkeypatch):
    config = make_config()
    read = []
    original = TokenCache.tokens
    monkeypatch.setattr(
        TokenCache, "tokens", lambda self, blocks: (read.append(list(blocks)), original(self, blocks))[1]
    )
    train(config, tmp_path / "run")
    assert np.array_equal(np.array(read[: config.steps_per_epoch]), epoch_plan(config, 1).blocks)
    assert np.array_equal(np.array(read[config.steps_per_epoch :]), epoch_plan(config, 2).blocks)


def test_packed_run_interleaves_and_averages(make_config, tmp_path, monkeypatch):
    config = make_config(tokens=4 * 8 * 4 * 2, packed={"workers": 2, "sync_every": 3})
    read = []
    original = TokenCache.tokens
    monkeypatch.setattr(
        TokenCache, "tokens", lambda self, blocks: (read.append(list(blocks)), original(self, blocks))[1]
    )
    train(config, tmp_path / "run")
    run = tmp_path / "run"
    plan = epoch_plan(config, 1)
    for w in range(2):  # worker w read stream batches w, w + 2, ... in order
        assert np.array_equal(np.array(read[w:4:2]), plan.worker(w, 2).blocks)
    for epoch in (1, 2):
        root = load_file(run / f"epoch-{epoch:03d}.safetensors")
        workers = [load_file(run / f"node-{w:03d}" / f"epoch-{epoch:03d}.safetensors") for w in range(2)]
        assert not _equal(workers[0], workers[1])  # epoch ends (step 2, 4) are not sync points (3)
        for name in root:
            torch.testing.assert_close(root[name], (workers[0][name] + workers[1][name]) / 2, rtol=1e-5, atol=1e-7)
    final = load_train_state(run / "final.pt")
    assert len(final["workers"]) == 2 and _equal(
        final["workers"][1]["model"], load_file(run / "node-001" / "epoch-002.safetensors")
    )
    record = json.loads((run / "train-log.jsonl").read_text().splitlines()[0])
    assert record["grad_norm_kind"] == "max_worker_pre_clip" and record["grad_norm"] == max(record["worker_grad_norms"])


def test_log_records_pre_clipping_norm(make_config, tmp_path):
    config = make_config(grad_clip=1e-3)
    train(config, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "train-log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, config.total_batches + 1))
    assert set(records[0]) >= {"step", "tokens", "loss", "grad_norm", "lr", "epoch"}
    assert records[-1]["tokens"] == config.total_batches * config.batch_tokens
    # Recompute step 1 from the initial weights: loss and unclipped norm.
    model = Llama(config.model, attention_backend=config.training.attention_backend)
    model.load_state_dict(load_file(tmp_path / "run" / "epoch-000.safetensors"))
    tokens = TokenCache(config.data.cache).tokens(epoch_plan(config, 1).blocks[0])
    loss = accumulate_batch_gradient(model, tokens, config.training.micro_batch_size)
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert records[0]["loss"] == pytest.approx(float(loss), rel=1e-6)
    assert records[0]["grad_norm"] == pytest.approx(float(norm), rel=1e-5) and records[0]["grad_norm"] > 1e-3


def test_accumulation_with_remainder_equals_full_batch_gradient(tiny_model_config):
    model = Llama(tiny_model_config).double()
    tokens = torch.randint(0, 16, (5, 9))
    loss = accumulate_batch_gradient(model, tokens, micro_batch_size=2)  # 2 + 2 + 1
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()
    full.backward()
    assert float(loss) == pytest.approx(float(full.detach()), abs=1e-14)
    for a, p in zip(accumulated, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=0, atol=1e-14)


def test_cache_too_small_writes_nothing(make_config, tmp_path):
    small = make_config()
    big = small.__class__(
        model=small.model,
        data=small.data,
        training=small.training.__class__(**{**small.training.__dict__, "tokens": 10 * small.training.tokens}),
    )
    with pytest.raises(ValueError, match="prepare a new cache with data.prepare_train_tokens="):
        train(big, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_packed_resume_is_bit_identical(make_config, tmp_path):
    config = make_config(tokens=4 * 8 * 4 * 2, packed={"workers": 2, "sync_every": 3})
    train(config, tmp_path / "full")
    train(config, tmp_path / "split", stop_after_epoch=1)
    train(config, tmp_path / "split")
    full, split = load_train_state(tmp_path / "full" / "final.pt"), load_train_state(tmp_path / "split" / "final.pt")
    for a, b in zip(full["workers"], split["workers"], strict=True):
        assert _equal(a["model"], b["model"])
    assert _equal(full["model"], split["model"])


def test_second_trainer_on_a_run_directory_is_refused(make_config, tmp_path):
    from tiny_llm.io import exclusive

    config, run = make_config(), tmp_path / "run"
    run.mkdir()
    with exclusive(run / ".train.lock", "training"):  # as a live trainer holds it
        with pytest.raises(ValueError, match=rf"another process \(pid {__import__('os').getpid()}\) is training"):
            train(config, run)
        assert sorted(p.name for p in run.iterdir()) == [".train.lock"]  # the refused one wrote nothing
    train(config, run)  # released: it trains, and a finished run keeps no lock file
    assert (run / "final.pt").exists() and not (run / ".train.lock").exists()


def test_log_cut_short_by_a_kill_is_repaired_and_a_corrupt_one_refused(make_config, tmp_path):
    config = make_config(epochs=3, tokens=4 * 8 * 3 * 3)
    train(config, tmp_path / "full")
    run = tmp_path / "split"
    train(config, run, stop_after_epoch=1)
    log = run / "train-log.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines) + '\n{"step": 99, "lo')  # the kill landed inside a write
    train(config, run)
    assert _equal(_weights(run / "final.pt"), _weights(tmp_path / "full" / "final.pt"))
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == list(
        range(1, config.total_batches + 1)
    )

    bad = tmp_path / "bad"
    train(config, bad, stop_after_epoch=1)
    text = (bad / "train-log.jsonl").read_text().splitlines()
    (bad / "train-log.jsonl").write_text("\n".join(["garbage", *text[1:]]) + "\n")
    before = {p.name: p.read_bytes() for p in bad.iterdir()}
    with pytest.raises(ValueError, match=r"train-log.jsonl line 1 is not a training log entry"):
        train(config, bad)
    assert {p.name: p.read_bytes() for p in bad.iterdir()} == before  # nothing rewritten, resolved.yaml included


def test_device_and_run_directory_errors(make_config, tmp_path):
    config = make_config()
    with pytest.raises(ValueError, match="--device: expected cpu, cuda, cuda:N or auto, got 'tpu'"):
        train(config, tmp_path / "a", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is available here; use --device cpu"):
            train(config, tmp_path / "b", device="cuda")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; choose another path"):
        train(config, tmp_path / "file")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_identical_runs_give_identical_bytes(make_config, tmp_path):
    config = make_config()
    train(config, tmp_path / "a")
    train(config, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        if name != "train-log.jsonl":  # the log records wall-clock times
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_killed_training_resumes_to_the_files_of_an_uninterrupted_run(make_config, tmp_path):
    """SIGKILL at random moments (a subprocess per attempt), then resume: the finished run has exactly
    the files, and the bytes, of an uninterrupted one (temporary files and resume.pt cleaned)."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from tiny_llm.config import config_to_dict

    config = make_config(epochs=24, tokens=4 * 8 * 3 * 24)  # 72 steps of ~10 ms
    train(config, tmp_path / "reference")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    killed = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "tiny_llm.cli",
        "--quiet",
        "train",
        "--config",
        str(tmp_path / "run.yaml"),
        "--run-dir",
        str(killed),
    ]
    log = killed / "train-log.jsonl"
    rng, kills = random.Random(3), 0

    def stamp():
        return log.stat().st_mtime_ns if log.exists() else None

    for _ in range(6):
        start = stamp()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while process.poll() is None and stamp() == start:
            time.sleep(0.002)  # wait until this attempt touches the log (after Python's start-up) ...
        time.sleep(rng.uniform(0, 0.12))  # ... then kill it anywhere: mid-step, mid-write, after final.pt
        kills += process.poll() is None
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert kills >= 3  # most attempts were killed while training
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    reference = tmp_path / "reference"
    assert sorted(os.listdir(killed)) == sorted(os.listdir(reference))
    for name in os.listdir(reference):
        if name != "train-log.jsonl":
            assert (killed / name).read_bytes() == (reference / name).read_bytes(), name
    steps = [json.loads(line)["step"] for line in (killed / "train-log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, config.total_batches + 1))


def test_kept_moments_train_on_to_the_next_kept_moments(make_config, tmp_path):
    """Epoch 1's weights and its kept moments, placed by name into a fresh trainer's optimizer, train
    epoch 2 to exactly epoch 2's weights and kept moments: every moment sits where the optimizer kept
    it (a misplaced one, even between tensors of one shape, would train elsewhere)."""
    config = make_config()
    run = tmp_path / "run"
    train(config, run)
    again = tmp_path / "again"
    again.mkdir()
    trainer = _Trainer(config, again, "cpu")
    trainer.workers[0].model.load_state_dict(_weights(run / "epoch-001.safetensors"))
    load_into(trainer.workers[0].optimizer, load_moments(run / "moments-001.safetensors"))
    trainer.step = config.steps_per_epoch
    trainer.run(None, io.StringIO())
    assert _equal(_weights(again / "epoch-002.safetensors"), _weights(run / "epoch-002.safetensors"))
    kept, trained = load_moments(run / "moments-002.safetensors"), load_moments(again / "moments-002.safetensors")
    assert kept.record() == trained.record() and kept.step == 2 * config.steps_per_epoch
    assert _equal(kept.exp_avg, trained.exp_avg) and _equal(kept.exp_avg_sq, trained.exp_avg_sq)
    # two tensors of one shape exchanged pass every shape check, and train elsewhere
    start = load_moments(run / "moments-001.safetensors")
    shapes = {n: t.shape for n, t in start.exp_avg_sq.items()}
    a, b = next(
        (a, b) for a in shapes for b in shapes if a < b and shapes[a] == shapes[b] and a.endswith("norm.weight")
    )
    start.exp_avg_sq[a], start.exp_avg_sq[b] = start.exp_avg_sq[b], start.exp_avg_sq[a]
    other = _Trainer(config, tmp_path / "again", "cpu")
    other.workers[0].model.load_state_dict(_weights(run / "epoch-001.safetensors"))
    load_into(other.workers[0].optimizer, start)
    other.step = config.steps_per_epoch
    other.run(None, io.StringIO())
    assert not _equal(load_moments(again / "moments-002.safetensors").exp_avg_sq, kept.exp_avg_sq)


def test_float64_training_starts_from_the_same_weights_and_follows_the_float32_run(make_config, tmp_path):
    """training.dtype: float64 draws the initialisation as float32 does and casts it, keeps
    weights, optimizer state and checkpoints in float64, resumes bit-identically, and takes the
    same steps as float32 up to float32's rounding."""
    single, double = (
        make_config(epochs=3, tokens=4 * 8 * 3 * 3),
        make_config(epochs=3, tokens=4 * 8 * 3 * 3, dtype="float64"),
    )
    train(single, tmp_path / "f32")
    train(double, tmp_path / "f64")
    init32, init64 = (_weights(tmp_path / run / "epoch-000.safetensors") for run in ("f32", "f64"))
    assert all(init64[k].dtype == torch.float64 and torch.equal(init64[k], init32[k].double()) for k in init32)
    final = load_train_state(tmp_path / "f64" / "final.pt")
    moments = final["workers"][0]["optimizer"]["state"][0]
    assert moments["exp_avg_sq"].dtype == torch.float64
    logs = [
        [json.loads(line)["loss"] for line in (tmp_path / run / "train-log.jsonl").read_text().splitlines()]
        for run in ("f32", "f64")
    ]
    assert logs[0] == pytest.approx(logs[1], rel=1e-4) and logs[0] != logs[1]
    train(double, tmp_path / "split", stop_after_epoch=1)
    train(double, tmp_path / "split")
    assert _equal(_weights(tmp_path / "split" / "final.pt"), _weights(tmp_path / "f64" / "final.pt"))
