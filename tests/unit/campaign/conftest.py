"""A project whose analyses import a tiny suite from a miniature of the local Hugging Face cache
(revisions step0, step1, step2, step4 of org/p), shared by the campaign's tests of imports; and
a project of one tiny run and one GPU analysis, shared by the planning tests."""

import sys
from pathlib import Path

import huggingface_hub
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, cache_revision, neox_suite
from workflow_plans import write_project


@pytest.fixture
def project(tmp_path, monkeypatch):
    folders = neox_suite(tmp_path / "saved", (0, 1, 2, 4))
    for step, folder in folders.items():
        cache_revision(tmp_path / "hf", "org/p", f"step{step}", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    (tmp_path / "a.txt").write_text("the suite's reference text " * 500)
    return tmp_path


@pytest.fixture
def suite_analysis():
    """The configuration of one analysis ``p`` of the given hf_checkpoints (offset case)."""

    def make(checkpoints):
        entry = {"config": "run.yaml", "hf_checkpoints": checkpoints, "tokens_per_step": 16, "cache_inputs": ["a.txt"]}
        return {"analyses": {"p": {**entry, "cases": ["offset"]}}}

    return make


@pytest.fixture
def workflow_project(tmp_path, monkeypatch):
    """A project directory with a run configuration and a timing entry for its GPU analysis
    (``workflow_plans.plan_config``)."""
    monkeypatch.chdir(tmp_path)
    return write_project(tmp_path)
