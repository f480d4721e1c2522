"""Every bad input through the command line: exit status 2, exactly one line on stderr naming the
file or key and what to do, no traceback, and nothing written anywhere (lock files included)."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from builders import make_oracle_run
from safetensors.torch import load_file, save_file

from tiny_llm.cli import main
from tiny_llm.config import config_to_dict
from tiny_llm.data.tokens import TokenCache
from tiny_llm.io import exclusive, sha256_file
from tiny_llm.training.loop import train


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """An ordinary and a packed run (finished), and an ordinary run stopped after epoch 1."""
    root = tmp_path_factory.mktemp("made")
    for name, extra in (
        ("ordinary", {}),
        ("packed", {"tokens": 3 * 6 * 4 * 2, "packed": {"workers": 2, "sync_every": 3}}),
    ):
        config = make_oracle_run(root / name, **extra)
        train(config, root / name / "run")
        TokenCache(config.data.cache).check_layout(config)  # its verification record exists, as after any use
    config = make_oracle_run(root / "ordinary")
    train(config, root / "stopped" / "run", stop_after_epoch=1)
    (root / "stopped" / "run.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    return root


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/tiny-llm-payload-ran",))


def _state(tmp, name="ordinary"):
    return [
        "analyze-state",
        "--run",
        str(tmp / name / "run"),
        "--case",
        "seen",
        "--device",
        "cpu",
        "--dtype",
        "float64",
        "--noise-samples",
        "1",
        "--random-samples",
        "1",
        "--output",
        str(tmp / "out" / "r.json"),
    ]


def _resave(path, change):
    state = load_file(path)
    save_file(change(state), path)


def _edit_shard(tmp, name, edit):
    cache = tmp / name / "cache"
    meta = json.loads((cache / "meta.json").read_text())
    shard = cache / meta["shards"][0]["file"]
    raw = bytearray(shard.read_bytes())
    edit(raw)
    shard.write_bytes(bytes(raw))
    return cache, meta, shard


def _big_ids(tmp):
    cache, meta, shard = _edit_shard(
        tmp, "ordinary", lambda raw: raw.__setitem__(slice(0, 2), (99).to_bytes(2, "little"))
    )
    meta["shards"][0]["sha256"] = sha256_file(shard)  # a cache made outside prepare-data, self-consistent
    (cache / "meta.json").write_text(json.dumps(meta))


def _holding(lock, what):
    """Setup that holds a lock (as a live process would) for the duration of the call."""
    return lambda tmp: exclusive(tmp / lock, what)


CASES = {
    # checkpoints
    "truncated safetensors": (
        lambda t: (t / "ordinary/run/epoch-001.safetensors").write_bytes(
            (t / "ordinary/run/epoch-001.safetensors").read_bytes()[:-50]
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "is truncated or corrupt",
    ),
    "pickled payload in final.pt": (
        lambda t: torch.save({"kind": "tiny_llm.train_state", "model": _Payload()}, t / "ordinary/run/final.pt"),
        lambda t: [*_state(t), "--checkpoint", "final.pt"],
        "is a pickle that would run code when read",
    ),
    "a memory budget of 0": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors", "--memory-budget-gb", "0"],
        r"--memory-budget-gb: expected a positive number or null, got 0",
    ),
    "a non-finite memory budget": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors", "--memory-budget-gb", "inf"],
        r"--memory-budget-gb: expected a positive number or null, got inf",
    ),
    "NaN weights": (
        lambda t: _resave(
            t / "ordinary/run/epoch-001.safetensors",
            lambda s: {**s, "norm.weight": torch.full_like(s["norm.weight"], float("nan"))},
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "non-finite values",
    ),
    "renamed tensor": (
        lambda t: _resave(
            t / "ordinary/run/epoch-001.safetensors",
            lambda s: {("norm.bias" if k == "norm.weight" else k): v for k, v in s.items()},
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        r"missing tensors \['norm.weight'\]; unexpected tensors \['norm.bias'\]",
    ),
    "wrong shape": (
        lambda t: _resave(
            t / "ordinary/run/epoch-001.safetensors",
            lambda s: {**s, "norm.weight": torch.ones(9, dtype=s["norm.weight"].dtype)},
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        r"norm.weight: shape \(9,\)",
    ),
    "differing aliases": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors", "--checkpoint", "epoch-002.safetensors"],
        "hold different parameter states",
    ),
    "missing checkpoint": (None, lambda t: [*_state(t), "--checkpoint", "epoch-009.safetensors"], "does not exist"),
    "worker checkpoint": (
        None,
        lambda t: [*_state(t, "packed"), "--checkpoint", "node-000/epoch-001.safetensors"],
        "is a worker checkpoint",
    ),
    "missing worker file": (
        lambda t: (t / "packed/run/node-001/epoch-001.safetensors").unlink(),
        lambda t: [*_state(t, "packed"), "--checkpoint", "epoch-001.safetensors"],
        "lacks worker files .*--no-consensus",
    ),
    # caches
    "shard bytes changed": (
        lambda t: _edit_shard(t, "ordinary", lambda raw: raw.__setitem__(4, raw[4] ^ 1)),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "changed after preparation",
    ),
    "token ids beyond the vocabulary": (
        _big_ids,
        lambda t: ["train", "--config", str(t / "stopped/run.yaml"), "--run-dir", str(t / "stopped/run")],
        "holds token id 99, beyond model.vocab_size=16",
    ),
    "damaged meta.json": (
        lambda t: (t / "ordinary/cache/meta.json").write_text("{oops"),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "meta.json is not valid JSON",
    ),
    "cache too small": (
        lambda t: (t / "ordinary/cache/meta.json").write_text(
            json.dumps(
                {
                    **json.loads((t / "ordinary/cache/meta.json").read_text()),
                    "shards": json.loads((t / "ordinary/cache/meta.json").read_text())["shards"][:1],
                }
            )
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "prepare a new cache with data.prepare_train_tokens",
    ),
    # configuration and options
    "bad config value": (
        None,
        lambda t: [
            "train",
            "--config",
            str(t / "stopped/run.yaml"),
            "--set",
            "training.lr=-1",
            "--run-dir",
            str(t / "new"),
        ],
        "training.lr",
    ),
    "unknown config key": (
        None,
        lambda t: [
            "train",
            "--config",
            str(t / "stopped/run.yaml"),
            "--set",
            "training.colour=1",
            "--run-dir",
            str(t / "new"),
        ],
        "colour",
    ),
    "YAML error": (
        lambda t: (t / "bad.yaml").write_text("model: {d_model: [\n"),
        lambda t: ["train", "--config", str(t / "bad.yaml"), "--run-dir", str(t / "new")],
        "is not valid YAML",
    ),
    "changed setting on resume": (
        None,
        lambda t: [
            "train",
            "--config",
            str(t / "stopped/run.yaml"),
            "--set",
            "training.lr=0.5",
            "--run-dir",
            str(t / "stopped/run"),
        ],
        "was made with other settings",
    ),
    "amp with float64": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors", "--amp"],
        "--amp requires --dtype float32",
    ),
    "finite differences under bf16 autocast": (
        None,
        lambda t: [
            *_state(t),
            "--checkpoint",
            "epoch-001.safetensors",
            "--dtype",
            "float32",
            "--amp",
            "--engine",
            "finite_difference",
        ],
        r"engine finite_difference: under bf16 autocast \(amp\) .* without amp",
    ),
    "bogus device for train": (
        None,
        lambda t: [
            "train",
            "--config",
            str(t / "stopped/run.yaml"),
            "--run-dir",
            str(t / "stopped/run"),
            "--device",
            "tpu",
        ],
        "--device: expected cpu",
    ),
    # outputs and run directories
    "output under a file": (
        lambda t: (t / "out").write_text("x"),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "is a file, not a folder",
    ),
    "output is a directory": (
        lambda t: (t / "out" / "r.json").mkdir(parents=True),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "is a directory",
    ),
    "run directory is a file": (
        lambda t: (t / "afile").write_text("x"),
        lambda t: ["train", "--config", str(t / "stopped/run.yaml"), "--run-dir", str(t / "afile")],
        "is a file; choose another path",
    ),
    # resume states and logs
    "truncated resume.pt": (
        lambda t: (t / "stopped/run/resume.pt").write_bytes((t / "stopped/run/resume.pt").read_bytes()[:200]),
        lambda t: ["train", "--config", str(t / "stopped/run.yaml"), "--run-dir", str(t / "stopped/run")],
        "resume.pt",
    ),
    "corrupt log line": (
        lambda t: (t / "stopped/run/train-log.jsonl").write_text(
            "garbage\n" + (t / "stopped/run/train-log.jsonl").read_text()
        ),
        lambda t: ["train", "--config", str(t / "stopped/run.yaml"), "--run-dir", str(t / "stopped/run")],
        "train-log.jsonl line 1 is not a training log entry",
    ),
    # the trajectory's successor
    "successor is the state itself": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors", "--successor", "epoch-001.safetensors"],
        r"successor epoch-001.safetensors: the same weights as the state measured",
    ),
    "successor with the trajectory off": (
        None,
        lambda t: [
            *_state(t),
            "--checkpoint",
            "epoch-001.safetensors",
            "--successor",
            "epoch-002.safetensors",
            "--no-trajectory",
        ],  # fmt: skip
        r"successor epoch-002.safetensors: given with the trajectory statistics off \(--no-trajectory",
    ),
    "successor is an earlier state": (
        None,
        lambda t: [*_state(t), "--checkpoint", "epoch-002.safetensors", "--successor", "epoch-001.safetensors"],
        r"successor epoch-001.safetensors: trained to step \d+, not after this state's step \d+",
    ),
    # identity and locks
    "result with other settings": (
        lambda t: (
            (t / "out").mkdir()
            or (t / "out" / "r.json").write_text(
                json.dumps({"identity": {"hash": "other"}, "state": {"key": "k"}, "case": "seen"})
            )
        ),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        "holds a result with other settings",
    ),
    "result being written": (
        _holding("out/.r.json.lock", "writing"),
        lambda t: [*_state(t), "--checkpoint", "epoch-001.safetensors"],
        r"another process \(pid \d+\) is writing",
    ),
    "run being trained": (
        _holding("stopped/run/.train.lock", "training"),
        lambda t: ["train", "--config", str(t / "stopped/run.yaml"), "--run-dir", str(t / "stopped/run")],
        r"another process \(pid \d+\) is training",
    ),
}


def _snapshot(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every file's size and modification time, and every folder (a lock taken and released inside
    a folder changes the folder's time only)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
    }


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_writes_nothing(made, tmp_path, capsys, case):
    setup, argv, message = CASES[case]
    for name in ("ordinary", "packed", "stopped"):
        shutil.copytree(made / name, tmp_path / name, symlinks=True)
    (tmp_path / "stopped/run.yaml").write_text(
        (made / "stopped/run.yaml").read_text().replace(str(made / "ordinary"), str(tmp_path / "ordinary"))
    )
    for run in ("ordinary", "packed", "stopped"):  # the copies use their own caches
        resolved = tmp_path / run / "run/resolved.yaml"
        resolved.write_text(
            resolved.read_text()
            .replace(str(made / run), str(tmp_path / run))
            .replace(str(made / "ordinary"), str(tmp_path / "ordinary"))
        )
    held = setup(tmp_path) if setup else None
    context = held if hasattr(held, "__enter__") else None
    before = _snapshot(tmp_path)
    capsys.readouterr()
    if context:
        with context:
            before = _snapshot(tmp_path)
            status = main(["--quiet", *argv(tmp_path)])
    else:
        status = main(["--quiet", *argv(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("tiny-llm ") and "Traceback" not in err, err
    assert re.search(message, err), err
    after = _snapshot(tmp_path)
    if context:  # the holder's lock file goes with the holder
        before = {k: v for k, v in before.items() if not k.endswith(".lock")}
        after = {k: v for k, v in after.items() if not k.endswith(".lock")}
    assert after == before, set(after.items()) ^ set(before.items())
    assert not Path("/tmp/tiny-llm-payload-ran").exists()
