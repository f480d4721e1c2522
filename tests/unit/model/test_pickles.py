"""One check reads every pickled weight file, on every path: a checkpoint folder, a revision in the
hub cache, a member of a suite, a shard named by an index, a training state given to export-hf.
Each refuses a pickle that would run code in one line naming the file, and never runs it (the
payload would create a file); plain tensor pickles still import, in both of PyTorch's layouts."""

import json
import pickle
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file

from tiny_llm.cli import main
from tiny_llm.model.checkpoint import load_train_state
from tiny_llm.model.pickles import check_pickle, pickle_globals

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, cache_revision, neox_suite


class _Payload:
    """Unpickling this would create a file."""

    marker: Path = Path("/nonexistent")

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil(path: Path, marker: Path, layout: str = "zip") -> None:
    """A weights file whose reading would create ``marker``, beside real tensors."""
    _Payload.marker = marker
    state = {"gpt_neox.embed_in.weight": torch.zeros(2), "x": _Payload()}
    if layout == "raw":
        with open(path, "wb") as handle:
            pickle.dump(state, handle, protocol=4)
    else:
        torch.save(state, path, _use_new_zipfile_serialization=layout == "zip")


def _as_bin(folder: Path) -> dict:
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    return state


@pytest.fixture
def suite(tmp_path, monkeypatch):
    folders = neox_suite(tmp_path / "saved", (0, 1, 2))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    return folders


def _refused(argv, marker, capsys, run_dir="runs/x"):
    capsys.readouterr()
    assert main(["--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not marker.exists() and not Path(run_dir).exists()
    return err


@pytest.mark.parametrize("layout", ["zip", "legacy", "raw"])
def test_a_folder_and_a_suite_member_that_would_run_code_are_refused(suite, tmp_path, capsys, layout):
    marker = tmp_path / "executed"
    _as_bin(suite[1])
    _evil(suite[1] / "pytorch_model.bin", marker, layout)
    err = _refused(["import-hf", str(suite[1]), "--run-dir", "runs/x", "--config", "run.yaml"], marker, capsys)
    assert f"{suite[1] / 'pytorch_model.bin'} is a pickle that would run code when read (it calls " in err
    members = [str(suite[s]) for s in (0, 1, 2)]  # a member of a suite: the same line
    argv = ["import-hf", *members, "--step", "0", "1", "2", "--run-dir", "runs/x", "--config", "run.yaml"]
    err = _refused(argv, marker, capsys)
    assert f"{suite[1] / 'pytorch_model.bin'} is a pickle that would run code when read" in err


def test_a_hub_revision_and_an_index_shard_that_would_run_code_are_refused(suite, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "executed"
    state = _as_bin(suite[2])
    keys = sorted(state)
    torch.save({k: state[k] for k in keys[1:]}, suite[2] / "pytorch_model-00001-of-00002.bin")
    _evil(suite[2] / "pytorch_model-00002-of-00002.bin", marker)
    weight_map = {k: "pytorch_model-00001-of-00002.bin" for k in keys[1:]}
    weight_map[keys[0]] = "pytorch_model-00002-of-00002.bin"
    (suite[2] / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    err = _refused(["import-hf", str(suite[2]), "--run-dir", "runs/x", "--config", "run.yaml"], marker, capsys)
    assert "pytorch_model-00002-of-00002.bin is a pickle that would run code when read" in err
    cache_revision(tmp_path / "hf", "org/evil", "step2", suite[2])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    argv = ["import-hf", "org/evil", "--revision", "step2", "--run-dir", "runs/x", "--config", "run.yaml"]
    err = _refused(argv, marker, capsys)
    assert "/snapshots/" in err and "pytorch_model-00002-of-00002.bin is a pickle that would run code" in err


def test_a_training_state_that_would_run_code_is_refused_by_export(suite, tmp_path, capsys):
    marker = tmp_path / "executed"
    assert main(["--quiet", "import-hf", str(suite[0]), "--run-dir", "runs/ok", "--config", "run.yaml"]) == 0
    _Payload.marker = marker
    torch.save({"kind": "tiny_llm.train_state", "model": _Payload()}, "runs/ok/final.pt")
    argv = ["export-hf", "--run", "runs/ok", "--checkpoint", "final.pt", "--out", "hf/out"]
    err = _refused(argv, marker, capsys, run_dir="hf/out")
    assert "runs/ok/final.pt is a pickle that would run code when read" in err
    with pytest.raises(ValueError, match="final.pt is a pickle that would run code when read"):
        load_train_state("runs/ok/final.pt")


@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_plain_tensor_pickles_pass_the_check_and_import(suite, tmp_path, layout):
    state = {k: v.half() for k, v in _as_bin(suite[1]).items()}
    torch.save(state, suite[1] / "pytorch_model.bin", _use_new_zipfile_serialization=layout == "zip")
    check_pickle(suite[1] / "pytorch_model.bin")
    assert {g.split(".")[0] for g in pickle_globals(suite[1] / "pytorch_model.bin")} <= {"torch", "collections"}
    assert main(["--quiet", "import-hf", str(suite[1]), "--run-dir", "runs/ok", "--config", "run.yaml"]) == 0


def test_a_damaged_pickle_is_one_line_naming_it(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"x": torch.zeros(100)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"pytorch_model.bin is truncated or corrupt \(a zip archive without") as error:
        check_pickle(path)
    assert "\n" not in str(error.value)
    path.write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"pytorch_model.bin is truncated or corrupt"):
        check_pickle(path)
