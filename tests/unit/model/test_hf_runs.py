"""Models trained elsewhere, measured right or refused: Trainer-style suites (GPT-NeoX through the
adapter, Llama natively) imported with their steps, tokens and tokenizer; an import that is whole
or absent whatever kills it; bad inputs refused in one line with nothing written; the cache bound
to the checkpoints' tokenizer; an export that transformers can generate text with."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt)
from safetensors.torch import load_file, save_file

from tiny_llm.cli import main
from tiny_llm.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_suites import BATCH, SEQ, corpus_text, make_suite, run_config_text


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    """A GPT-NeoX suite with num_input_tokens_seen and a Llama suite without, made once."""
    root = tmp_path_factory.mktemp("suites")
    return {"neox": make_suite(root / "neox"), "llama": make_suite(root / "llama", "llama", tokens_seen=False)}


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(run_config_text())
    return tmp_path


def _refused(capsys, argv, *fragments):
    """exit 2, one line on stderr naming what is wrong."""
    capsys.readouterr()
    assert main(["--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_a_trainer_suite_imports_with_its_steps_tokens_and_tokenizer_and_nothing_it_did_not_have(
    suites, project, caplog
):
    neox = [str(p) for p in suites["neox"]]
    assert main(["--quiet", "import-hf", *neox, "--run-dir", "runs/neox", "--config", "run.yaml"]) == 0
    record = json.loads(Path("runs/neox/imported.json").read_text())
    assert record["complete"] and record["architecture"] == "gpt_neox"  # Pythia's architecture: native
    assert [(c["step"], c["tokens"], c["tokens_source"]) for c in record["checkpoints"]] == [
        (s, s * BATCH * SEQ, "trainer_state.json num_input_tokens_seen") for s in (2, 4, 6)
    ]
    assert record["tokenizer"]["type"] == "huggingface"
    assert set(record["tokenizer"]["files"]) == {"tokenizer.json", "tokenizer_config.json"}  # not the weights
    assert sorted(p.name for p in Path("runs/neox/tokenizer").iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    text = Path("runs/neox/resolved.yaml").read_text()
    assert "lr:" not in text and "weight_decay" not in text and "grad_clip" not in text and "batch_size: 4" in text
    from tiny_llm.model.checkpoint import load_weights

    _, metadata = load_weights(Path("runs/neox/epoch-002.safetensors"))
    assert (
        metadata["source"] == "checkpoint-6" and metadata["step"] == "6" and metadata["tokens"] == str(6 * BATCH * SEQ)
    )
    # Llama without num_input_tokens_seen: tokens derived from the step when told how, else unknown (a warning)
    llama = [str(p) for p in suites["llama"]]
    assert (
        main(
            [
                "--quiet",
                "import-hf",
                *llama,
                "--run-dir",
                "runs/derived",
                "--config",
                "run.yaml",
                "--tokens-per-step",
                "96",
            ]
        )
        == 0
    )
    record = json.loads(Path("runs/derived/imported.json").read_text())
    assert record["architecture"] == "llama"
    assert [(c["tokens"], c["tokens_source"]) for c in record["checkpoints"]][0] == (192, "step x tokens_per_step (96)")
    caplog.clear()
    assert main(["import-hf", *llama, "--run-dir", "runs/unknown", "--config", "run.yaml"]) == 0
    assert "training tokens unknown for" in caplog.text and "train_batch_size 4 per device" in caplog.text
    _, metadata = load_weights(Path("runs/unknown/epoch-000.safetensors"))
    assert "tokens" not in metadata and metadata["step"] == "2"


def _log(run: str) -> list[dict]:
    path = Path(run) / "train-log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_trainers_logged_losses_become_the_runs_training_log(suites, project, tmp_path):
    """The newest trainer_state.json's log_history: every training entry, with the tokens the
    checkpoints take (seen, or step x tokens_per_step, else none); none without a Trainer's state."""
    neox = suites["neox"]
    assert main(["--quiet", "import-hf", *map(str, neox), "--run-dir", "runs/neox", "--config", "run.yaml"]) == 0
    history = [e for e in json.loads((neox[-1] / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    log = _log("runs/neox")
    assert [r["step"] for r in log] == [2, 4, 6] == [e["step"] for e in history]  # logging_steps 2, up to step 6
    assert [r["loss"] for r in log] == [e["loss"] for e in history]
    assert [r["tokens"] for r in log] == [s * BATCH * SEQ for s in (2, 4, 6)]  # the checkpoints' own count
    assert all(r["grad_norm"] > 0 and r["grad_norm_kind"] == "pre_clip" and r["lr"] > 0 for r in log)
    assert {r["source"] for r in log} == {"trainer_state.json"}
    record = json.loads(Path("runs/neox/imported.json").read_text())["training_log"]
    assert record == {"source": str((neox[-1] / "trainer_state.json").resolve()), "records": 3}
    # the first two checkpoints only: the log ends at the newest one given
    argv = ["--quiet", "import-hf", *map(str, neox[:2]), "--run-dir", "runs/two", "--config", "run.yaml"]
    assert main(argv) == 0 and [r["step"] for r in _log("runs/two")] == [2, 4]
    llama = [str(p) for p in suites["llama"]]  # no num_input_tokens_seen
    argv = ["--quiet", "import-hf", *llama, "--config", "run.yaml"]
    assert main([*argv, "--run-dir", "runs/derived", "--tokens-per-step", "96"]) == 0
    assert [r["tokens"] for r in _log("runs/derived")] == [192, 384, 576]
    assert main([*argv, "--run-dir", "runs/unknown"]) == 0
    unknown = _log("runs/unknown")
    assert [r["step"] for r in unknown] == [2, 4, 6] and not any("tokens" in r for r in unknown)
    # checkpoints without a Trainer's state (as a hub's revisions come): no training log, and the record says so
    bare = []
    for path in neox:
        shutil.copytree(path, tmp_path / "bare" / path.name)
        (tmp_path / "bare" / path.name / "trainer_state.json").unlink()
        bare.append(str(tmp_path / "bare" / path.name))
    argv = ["--quiet", "import-hf", *bare, "--step", "2", "4", "6", "--run-dir", "runs/bare", "--config", "run.yaml"]
    assert main(argv) == 0
    assert not Path("runs/bare/train-log.jsonl").exists()
    assert json.loads(Path("runs/bare/imported.json").read_text())["training_log"] is None


@pytest.mark.parametrize(
    "defect, fragment",
    [
        ("loss", "log_history entry 1 has step"),
        ("backwards", "does not come after step"),
        ("past", "past the global_step"),
    ],
)
def test_a_trainer_log_that_is_not_a_log_is_refused_by_name(suites, project, tmp_path, capsys, defect, fragment):
    suite = tmp_path / "suite"
    for path in suites["neox"]:
        shutil.copytree(path, suite / path.name)
    state_path = suite / suites["neox"][-1].name / "trainer_state.json"
    state = json.loads(state_path.read_text())
    training = [e for e in state["log_history"] if "loss" in e]
    if defect == "loss":
        state["log_history"][1]["loss"] = "low"
    elif defect == "backwards":
        training[1]["step"] = training[0]["step"] - 1 if training[0]["step"] else 0
    else:
        training[-1]["step"] = state["global_step"] + 1
    state_path.write_text(json.dumps(state))
    argv = ["import-hf", *map(str, sorted(suite.iterdir())), "--run-dir", "runs/bad", "--config", "run.yaml"]
    _refused(capsys, argv, "trainer_state.json: log_history entry", fragment, "fix the file")
    assert not Path("runs/bad").exists()


def test_tokens_per_step_of_zero_or_contradicting_the_trainer_is_refused(suites, project, capsys):
    argv = ["import-hf", *map(str, suites["neox"]), "--run-dir", "runs/bad", "--config", "run.yaml"]
    _refused(capsys, [*argv, "--tokens-per-step", "0"], "tokens_per_step: expected a positive integer")
    assert not Path("runs/bad").exists()
    # the suite's Trainer counted BATCH x SEQ tokens a step: a tokens_per_step that says otherwise is refused
    _refused(
        capsys,
        [*argv, "--tokens-per-step", str(BATCH * SEQ + 1)],
        f"tokens_per_step {BATCH * SEQ + 1} puts step 2 at {2 * (BATCH * SEQ + 1)} tokens, but",
        f"counted {2 * BATCH * SEQ} (num_input_tokens_seen)",
    )
    assert not Path("runs/bad").exists()
    assert main(["--quiet", *argv, "--tokens-per-step", str(BATCH * SEQ)]) == 0  # agreeing with it is fine


def test_tokens_that_cannot_be_counts_or_contradict_tokens_per_step_are_refused(suites, project, capsys, tmp_path):
    """A negative num_input_tokens_seen is refused by name, not taken for unknown tokens; a
    tokens_per_step that contradicts the tokens given is refused, not ignored."""
    copies = [Path(shutil.copytree(p, tmp_path / p.name)) for p in suites["neox"]]
    state = json.loads((copies[0] / "trainer_state.json").read_text())
    (copies[0] / "trainer_state.json").write_text(json.dumps({**state, "num_input_tokens_seen": -5}))
    argv = ["import-hf", *map(str, copies), "--run-dir", "runs/bad", "--config", "run.yaml"]
    _refused(capsys, argv, "trainer_state.json: num_input_tokens_seen -5 is not a count of tokens")
    argv = ["import-hf", *map(str, suites["neox"]), "--run-dir", "runs/bad", "--config", "run.yaml"]
    given = ["--tokens", *(str(7 * s) for s in (2, 4, 6)), "--tokens-per-step", "8"]
    _refused(capsys, [*argv, *given], "tokens_per_step 8 puts", "at 16 tokens, but its tokens are given as 14")
    assert not Path("runs/bad").exists()


def _corrupt(kind, path: Path):
    """Break one file of a copied checkpoint directory the way ``kind`` says."""
    config = json.loads((path / "config.json").read_text())
    weights = path / "model.safetensors"
    if kind == "config-not-json":
        (path / "config.json").write_text("{not json")
    elif kind == "config-truncated":
        (path / "config.json").write_text((path / "config.json").read_text()[:40])
    elif kind == "config-not-object":
        (path / "config.json").write_text("[1, 2]")
    elif kind == "config-vocab":
        (path / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 8}))
    elif kind == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    elif kind in ("weights-shape", "weights-nan"):
        state = load_file(weights)
        key = next(k for k in state if "mlp" in k or "dense_h_to_4h" in k)
        state[key] = state[key][:-1] if kind == "weights-shape" else state[key].fill_(float("nan"))
        save_file(state, str(weights), metadata={"format": "pt"})
    elif kind == "tokenizer-corrupt":
        (path / "tokenizer.json").write_text((path / "tokenizer.json").read_text()[:100])
    elif kind == "trainer-state-corrupt":
        (path / "trainer_state.json").write_text('{"global_step": ')
    elif kind == "tokenizer-other":
        other = json.loads((path / "tokenizer.json").read_text())
        other["model"]["vocab"] = {k: v for k, v in list(other["model"]["vocab"].items())[:-1]}
        other["model"]["merges"] = other["model"]["merges"][:-1]
        (path / "tokenizer.json").write_text(json.dumps(other))


@pytest.mark.parametrize("architecture", ["neox", "llama"])
@pytest.mark.parametrize(
    "kind, fragments",
    [
        ("config-not-json", ["config.json is not valid JSON"]),
        ("config-truncated", ["config.json is not valid JSON"]),
        ("config-not-object", ["config.json holds a JSON list, not an object"]),
        ("config-vocab", ["config.json", "vocab_size"]),
        ("weights-truncated", ["model.safetensors"]),
        ("weights-shape", ["checkpoint-4"]),
        ("weights-nan", ["checkpoint-4", "non-finite"]),
        ("tokenizer-corrupt", ["tokenizer.json"]),
        ("trainer-state-corrupt", ["trainer_state.json is not valid JSON"]),
        ("tokenizer-other", ["carry different tokenizers"]),
    ],
)
def test_a_bad_checkpoint_is_refused_in_one_line_and_nothing_is_written(
    suites, project, capsys, architecture, kind, fragments
):
    copies = []
    for path in suites[architecture][:2]:
        shutil.copytree(path, project / "in" / path.name)
        copies.append(project / "in" / path.name)
    for copy in copies if kind == "config-vocab" else copies[1:]:  # one configuration, not the weights'
        _corrupt(kind, copy)
    _refused(capsys, ["import-hf", *map(str, copies), "--run-dir", "runs/bad", "--config", "run.yaml"], *fragments)
    assert not Path("runs/bad").exists() and not list(Path("runs").glob(".*")) if Path("runs").exists() else True


def test_a_refused_import_of_checkpoints_without_token_counts_prints_one_line(suites, project, capsys, caplog):
    """Unknown training tokens are a warning, said only once everything else is checked: a refusal
    is the one line a user reads."""
    copies = []
    for path in suites["llama"][:2]:
        shutil.copytree(path, project / "in" / path.name)
        (project / "in" / path.name / "trainer_state.json").unlink()  # no token counts anywhere
        copies.append(str(project / "in" / path.name))
    _corrupt("weights-nan", Path(copies[1]))
    argv = ["import-hf", *copies, "--run-dir", "runs/bad", "--config", "run.yaml", "--step", "2", "4"]
    _refused(capsys, argv, "non-finite")
    assert "training tokens unknown" not in caplog.text, caplog.text


def test_order_duplicates_and_counts_are_refused_by_name(suites, project, capsys):
    a, b, c = map(str, suites["neox"])
    run = ["--run-dir", "runs/x", "--config", "run.yaml"]
    _refused(capsys, ["import-hf", c, a, *run], "out of training order", "checkpoint-2 (step 2) comes after")
    _refused(capsys, ["import-hf", a, a, *run], "is given twice")
    _refused(capsys, ["import-hf", a, b, *run, "--step", "100", "100"], "out of training order")
    _refused(capsys, ["import-hf", a, b, *run, "--tokens", "900", "800"], "out of training order", "800 tokens")
    _refused(capsys, ["import-hf", a, *run, "--step", "-5"], "expected a non-negative integer, got -5")
    _refused(
        capsys, ["import-hf", a, b, *run, "--step", "5"], "--step: give one per checkpoint (2 checkpoints, 1 given)"
    )
    _refused(capsys, ["import-hf", a, "hf/missing", *run], "hf/missing is not a local directory")
    assert not Path("runs").exists()


_KILLED_IMPORT = """
import sys, time
import tiny_llm.model.hf_runs as runs
from tiny_llm.cli import main
original = runs.save_weights if hasattr(runs, "save_weights") else None
import tiny_llm.model.checkpoint as checkpoint
save = checkpoint.save_weights
def slow(*args, **kwargs):
    save(*args, **kwargs)
    time.sleep(0.3)  # widen the window between files so that a kill lands inside the import
checkpoint.save_weights = slow
sys.exit(main(sys.argv[1:]))
"""


def test_an_import_killed_anywhere_leaves_nothing_or_all_and_never_a_run_train_would_take(suites, project, capsys):
    """SIGKILL at several points of the write: afterwards the run directory is absent or a complete
    import; train and a seen analysis refuse whatever is there; the rerun completes."""
    neox = [str(p) for p in suites["neox"]]
    argv = ["import-hf", *neox, "--run-dir", "runs/killed", "--config", "run.yaml"]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", _KILLED_IMPORT, "--quiet", *argv, "--run-dir", "runs/timing"], check=True)
    whole = time.perf_counter() - start
    outcomes = set()
    for fraction in (0.2, 0.45, 0.6, 0.75, 0.9):
        shutil.rmtree("runs/killed", ignore_errors=True)
        process = subprocess.Popen([sys.executable, "-c", _KILLED_IMPORT, "--quiet", *argv])
        time.sleep(fraction * whole)
        process.send_signal(signal.SIGKILL)
        process.wait()
        run = Path("runs/killed")
        if run.exists():
            record = json.loads((run / "imported.json").read_text())
            assert record["complete"] and len(record["checkpoints"]) == 3
            assert all((run / c["checkpoint"]).exists() for c in record["checkpoints"])
            outcomes.add("complete")
        else:
            outcomes.add("absent")
        for leftover in Path("runs").glob(".killed.import-*"):  # what a killed import leaves: marked imported
            assert (leftover / "imported.json").exists()
            _refused(capsys, ["train", "--run-dir", str(leftover)], "holds imported weights")
        if run.exists():
            _refused(capsys, ["train", "--run-dir", str(run)], "holds imported weights")
    assert "absent" in outcomes, outcomes
    shutil.rmtree("runs/killed", ignore_errors=True)
    assert main(["--quiet", *argv]) == 0  # the rerun removes what the killed ones left, and completes
    assert not list(Path("runs").glob(".killed.import-*"))
    assert json.loads(Path("runs/killed/imported.json").read_text())["complete"]


def test_a_cache_of_another_tokenizer_is_refused_before_any_work(suites, project, capsys):
    (project / "corpus.txt").write_text(corpus_text())
    neox = [str(p) for p in suites["neox"]]
    assert main(["--quiet", "import-hf", *neox, "--run-dir", "runs/neox", "--config", "run.yaml"]) == 0
    analysis = [
        "analyze-state",
        "--run",
        "runs/neox",
        "--checkpoint",
        "epoch-000.safetensors",
        "--case",
        "offset",
        "--output",
        "out/r.json",
        "--device",
        "cpu",
        "--dtype",
        "float64",
        "--engine",
        "double_backward",
        "--noise-samples",
        "2",
        "--random-samples",
        "2",
        "--directions-per-pass",
        "2",
    ]
    # bytes
    assert main(["--quiet", "prepare-data", "--config", "run.yaml", "--source", "text", "corpus.txt"]) == 0
    _refused(capsys, analysis, "came with the tokenizer", "was encoded with bytes", "--tokenizer")
    assert not Path("out").exists()
    # another BPE
    from hf_suites import train_tokenizer

    train_tokenizer(project / "other", corpus_text(seed=9), vocab_size=290)
    shutil.rmtree("cache")
    assert (
        main(
            [
                "--quiet",
                "prepare-data",
                "--config",
                "run.yaml",
                "--source",
                "text",
                "--tokenizer",
                "other",
                "corpus.txt",
            ]
        )
        == 0
    )
    _refused(capsys, analysis, "came with the tokenizer", "was encoded with the tokenizer", "other")
    # their own: measured (a seen analysis is refused for an imported run)
    shutil.rmtree("cache")
    assert (
        main(
            [
                "--quiet",
                "prepare-data",
                "--config",
                "run.yaml",
                "--source",
                "text",
                "--tokenizer",
                neox[0],
                "corpus.txt",
            ]
        )
        == 0
    )
    assert main(["--quiet", *analysis]) == 0
    _refused(
        capsys, [*analysis[:6], "seen", *analysis[7:8], "out/seen.json", *analysis[9:]], "seen and unseen do not apply"
    )


def test_prepare_data_refuses_a_tokenizer_larger_than_the_model(suites, project, capsys):
    (project / "corpus.txt").write_text(corpus_text(2000))
    _refused(
        capsys,
        [
            "prepare-data",
            "--config",
            "run.yaml",
            "--set",
            "model.vocab_size=256",
            "--source",
            "text",
            "--tokenizer",
            str(suites["neox"][0]),
            "corpus.txt",
        ],
        "exceeds the model.vocab_size",
    )
    (project / "empty").mkdir()
    _refused(
        capsys,
        ["prepare-data", "--config", "run.yaml", "--source", "text", "--tokenizer", "empty", "corpus.txt"],
        "has no tokenizer.json",
    )
    assert not Path("cache").exists()


def test_an_export_carries_its_tokenizer_and_generates_text_in_transformers(suites, project, tmp_path):
    neox = [str(p) for p in suites["neox"]]
    assert main(["--quiet", "import-hf", *neox, "--run-dir", "runs/neox", "--config", "run.yaml"]) == 0
    assert (
        main(
            ["--quiet", "export-hf", "--run", "runs/neox", "--checkpoint", "epoch-002.safetensors", "--out", "hf/neox"]
        )
        == 0
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained("hf/neox")
    ids = tokenizer("ada sees the red cat", return_tensors="pt").input_ids
    assert ids.numel() > 0
    model = transformers.AutoModelForCausalLM.from_pretrained("hf/neox")
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + 4 and isinstance(tokenizer.decode(out[0]), str)


def test_a_byte_level_export_opens_as_a_tokenizer_whose_ids_are_the_bytes(project):
    """The demo's byte cache: the export's tokenizer encodes text to its UTF-8 bytes and back."""
    from tiny_llm.config import config_from_dict
    from tiny_llm.data.corpus import Source, prepare_source_cache
    from tiny_llm.model.checkpoint import save_weights
    from tiny_llm.model.llama import Llama

    config = config_from_dict(
        {
            "model": {"max_seq_len": 16},
            "data": {"cache": "cache/bytes", "seq_len": 12, "shuffle_group_blocks": 4},
            "training": {"batch_size": 4, "micro_batch_size": 4, "tokens": 96, "epochs": 1},
        }
    )
    (project / "text.txt").write_text(corpus_text(4000))
    prepare_source_cache(config.data, Source("text", (project / "text.txt",)))
    Path("runs/bytes").mkdir(parents=True)
    from tiny_llm.config import dump_config

    Path("runs/bytes/resolved.yaml").write_text(dump_config(config))
    torch.manual_seed(0)
    save_weights("runs/bytes/epoch-000.safetensors", Llama(config.model).state_dict(), {"step": 0, "tokens": 0})
    assert (
        main(
            [
                "--quiet",
                "export-hf",
                "--run",
                "runs/bytes",
                "--checkpoint",
                "epoch-000.safetensors",
                "--out",
                "hf/bytes",
            ]
        )
        == 0
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained("hf/bytes")
    text = "ada sees 12 + 3 = 15.\n\tdone ö"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids == list(text.encode()) and tokenizer.decode(ids) == text
    model = transformers.AutoModelForCausalLM.from_pretrained("hf/bytes")
    out = model.generate(torch.tensor([ids[:5]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8)


def test_a_half_made_directory_and_an_unfinished_record_are_named(project, suites, capsys):
    Path("runs/old").mkdir(parents=True)
    Path("runs/old/epoch-000.safetensors").write_bytes(b"x")
    _refused(
        capsys,
        ["import-hf", str(suites["neox"][0]), "--run-dir", "runs/old", "--config", "run.yaml"],
        "half-made import",
    )
    Path("runs/half").mkdir()
    Path("runs/half/imported.json").write_text(json.dumps({"complete": False, "architecture": "hf"}))
    Path("runs/half/resolved.yaml").write_text(run_config_text())
    _refused(
        capsys,
        [
            "analyze-state",
            "--run",
            "runs/half",
            "--checkpoint",
            "epoch-000.safetensors",
            "--case",
            "offset",
            "--output",
            "out/r.json",
        ],
        "the import did not finish",
    )
    assert load_config("run.yaml").training.batch_size == BATCH and os.path.exists("run.yaml")


def test_a_pythia_suite_measured_natively_equals_the_adapter(suites, project, monkeypatch):
    """The same GPT-NeoX checkpoints, imported natively (measured with adjoint) and through the
    adapter (transformers' own model, measured with double_backward), give the same statistics and
    standard errors in float64 to 1e-10 (transformers' float32 shortcuts swapped for float64). The
    native model registers its parameters in transformers' order, so the seeded directions agree."""
    from hf_float64 import float64_transformers

    float64_transformers(monkeypatch)
    neox = [str(p) for p in suites["neox"]]
    (project / "corpus.txt").write_text(corpus_text())
    prepare = ["prepare-data", "--config", "run.yaml", "--source", "text", "--tokenizer", neox[0], "corpus.txt"]
    assert main(["--quiet", *prepare]) == 0
    results = {}
    for name, engine, extra in (("native", "adjoint", []), ("adapter", "double_backward", ["--adapter"])):
        assert main(["--quiet", "import-hf", *neox, "--run-dir", f"runs/{name}", "--config", "run.yaml", *extra]) == 0
        analysis = ["analyze-state", "--run", f"runs/{name}", "--checkpoint", "epoch-002.safetensors"]
        analysis += ["--case", "offset", "--output", f"out/{name}.json", "--device", "cpu", "--dtype", "float64"]
        analysis += ["--engine", engine, "--noise-samples", "3", "--random-samples", "3", "--directions-per-pass", "2"]
        assert main(["--quiet", *analysis]) == 0
        results[name] = json.loads(Path(f"out/{name}.json").read_text())
    native, adapter = results["native"], results["adapter"]
    assert load_config("runs/native/resolved.yaml").model.architecture == "gpt_neox"
    assert load_config("runs/adapter/resolved.yaml").model.architecture == "hf"
    for part in ("statistics", "standard_errors"):
        for key, value in adapter[part].items():
            if value is None or native[part].get(key) is None:
                continue  # the Gauss–Newton split: the jet engines only
            assert abs(native[part][key] - value) <= 1e-10 * max(1.0, abs(value)), (part, key, native[part][key], value)
    assert native["statistics"]["noise_gauss_newton"] is not None
    assert adapter["precision"]["below_float64"] == [] and adapter["precision"]["gradient_rounding"] is None


def test_an_operation_below_float64_sets_a_measured_floor_that_every_result_and_the_manifest_carry(
    suites, project, monkeypatch, capsys
):
    """An adapter's model whose code keeps one operation below float64 (here its MLP's input rounded
    through float16, which the float64 mode cannot lift): the analysis runs with an exact engine,
    records the operation and its measured floor, the manifest gathers them; finite differences are
    refused by name, with nothing written."""
    from tiny_llm.results.manifest import precision_floor

    module = transformers.models.gpt_neox.modeling_gpt_neox
    forward = module.GPTNeoXMLP.forward
    monkeypatch.setattr(module.GPTNeoXMLP, "forward", lambda self, h: forward(self, h.half().to(h.dtype)))
    neox = [str(p) for p in suites["neox"]]
    (project / "corpus.txt").write_text(corpus_text())
    prepare = ["prepare-data", "--config", "run.yaml", "--source", "text", "--tokenizer", neox[0], "corpus.txt"]
    assert main(["--quiet", *prepare]) == 0
    assert main(["--quiet", "import-hf", *neox, "--run-dir", "runs/a", "--config", "run.yaml", "--adapter"]) == 0
    analysis = ["analyze-state", "--run", "runs/a", "--checkpoint", "epoch-002.safetensors", "--case", "offset"]
    analysis += ["--device", "cpu", "--dtype", "float64", "--noise-samples", "2", "--random-samples", "2"]
    _refused(
        capsys,
        [*analysis, "--output", "out/fd.json", "--engine", "finite_difference"],
        "finite differences in float64: this model computes half below float64",
    )
    assert not Path("out/fd.json").exists()
    assert main(["--quiet", *analysis, "--output", "out/r.json", "--engine", "double_backward"]) == 0
    precision = json.loads(Path("out/r.json").read_text())["precision"]
    assert precision["below_float64"] == ["half"] and 1e-6 < precision["gradient_rounding"] < 1e-1
    floor = precision_floor({("key", "offset"): {"precision": precision}})
    assert floor == {"operations": ["half"], "gradient_rounding": precision["gradient_rounding"], "results": 1}
    assert precision_floor({("key", "offset"): {"precision": {"below_float64": []}}}) is None
