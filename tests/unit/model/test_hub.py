"""Checkpoint suites as downloaded: revisions resolved offline in a miniature of the local Hugging
Face cache, their steps and tokens read from their names, selections, and the import of a suite
whose revisions are safetensors and float16 ``pytorch_model.bin`` alike."""

import json
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file

from tiny_llm.cli import main
from tiny_llm.model.checkpoint import load_weights
from tiny_llm.model.hub import (
    HubRevision,
    cached_revisions,
    expand_checkpoints,
    resolve_revision,
    revision_position,
    select_revisions,
    tokens_rounding,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, alias_revision, as_bin, cache_revision, neox_suite

REPO = "org/pythia-tiny"
STEPS = (0, 1, 2, 4, 8, 16, 32, 64)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A cache holding the suite's revisions step0 ... step64 (step2 as a float16 .bin), and the
    original folders."""
    root = tmp_path_factory.mktemp("hub")
    folders = neox_suite(root / "saved", STEPS)
    as_bin(folders[2], torch.float16)
    for step, folder in folders.items():
        cache_revision(root / "cache", REPO, f"step{step}", folder)
    alias_revision(root / "cache", REPO, "main", "step64")  # as downloaded: main is the last step's commit
    cache_revision(root / "cache", REPO, "v-other", folders[32])  # a ref without a step, of its own commit
    return root / "cache", folders


@pytest.mark.parametrize(
    "name, expected",
    [
        ("step1000", (1000, None)),
        ("stage1-step1000-tokens4B", (1000, 4_000_000_000)),
        ("stage2-ingredient1-step11931-tokens50B", (11931, 50_000_000_000)),
        ("step5-tokens2.5M", (5, 2_500_000)),
        ("main", (None, None)),
        ("mystep12", (None, None)),
    ],
)
def test_a_revision_name_gives_its_step_and_tokens(name, expected):
    assert revision_position(name) == expected


def test_a_named_token_count_is_as_exact_as_its_digits():
    assert tokens_rounding("stage1-step1000-tokens4B") == 0.5e9
    assert tokens_rounding("step5-tokens2.5M") == 0.05e6
    assert tokens_rounding("step5") == 0


def test_cached_revisions_resolve_offline_in_training_order(hub):
    cache, folders = hub
    revisions = cached_revisions(REPO, cache)
    assert [r.revision for r in revisions] == [f"step{s}" for s in STEPS] + ["main", "v-other"]
    assert revisions[-2].commit == revisions[-3].commit != revisions[-1].commit
    assert (
        resolve_revision(REPO, "step4", cache).joinpath("config.json").read_text()
        == (folders[4] / "config.json").read_text()
    )
    with pytest.raises(ValueError, match=r"org/pythia-tiny at revision step3 is not in the local Hugging Face cache"):
        resolve_revision(REPO, "step3", cache)
    with pytest.raises(ValueError, match=r"fetch it first: hf download org/other --revision step3"):
        resolve_revision("org/other", "step3", cache)
    with pytest.raises(ValueError, match=r"org/other has no named revision in the local Hugging Face cache"):
        cached_revisions("org/other", cache)


def test_cached_revisions_are_the_refs_huggingface_hub_finds(hub):
    """The refs are read directly (a scan of the cache stats every file); huggingface_hub's own
    scan finds the same names and commits, and a ref to a missing snapshot is refused by name."""
    from huggingface_hub import scan_cache_dir

    cache, _ = hub
    scanned = {
        ref: revision.commit_hash
        for repo in scan_cache_dir(cache).repos
        if repo.repo_id == REPO
        for revision in repo.revisions
        for ref in revision.refs
    }
    assert {r.revision: r.commit for r in cached_revisions(REPO, cache)} == scanned
    refs = cache / f"models--{REPO.replace('/', '--')}" / "refs"
    (refs / "step9").write_text("0" * 40)
    try:
        missing = r"revision step9 names commit 0{40}, which has no snapshot.*--revision step9"
        with pytest.raises(ValueError, match=missing):
            cached_revisions(REPO, cache)
    finally:
        (refs / "step9").unlink()


def test_a_suite_is_selected_by_names_range_stride_or_log_spacing():
    revisions = [HubRevision(REPO, f"step{s}", s, None, f"c{s}") for s in STEPS]
    revisions += [HubRevision(REPO, "main", None, None, "c64"), HubRevision(REPO, "v1", None, None, "c-v1")]

    def steps(selection, first_step=0, notes=None):
        return [r.step for r in select_revisions(revisions, selection, "k", first_step, notes)]

    notes = []
    assert steps("all", notes=notes) == [*STEPS]  # main is step64's commit: one state, named step64
    assert notes == [
        "k: main is the same commit as step64: measured once, as step64",
        "k: v1 left out: its name carries no step (name it in a list to measure it)",
    ]
    notes = []
    assert steps(["step64", "main", "v1"], notes=notes) == [64, None]  # named: kept, but once per commit
    assert notes == ["k: main is the same commit as step64: measured once, as step64"]
    notes = []
    assert steps({"log_spaced": 3}, first_step=1, notes=notes) == [1, 8, 64]  # a case needing trained steps
    assert notes[2] == (
        "k: step0 left out: the analysis's cases need checkpoints that trained at least 1 step(s) (name "
        "revisions in a list to choose them yourself)"
    )
    assert steps(["step4", "step1"]) == [4, 1]
    assert steps({"min_step": 2, "max_step": 32}) == [2, 4, 8, 16, 32]
    assert steps({"every": 3}) == [0, 4, 32]
    assert steps({"log_spaced": 3}) == [0, 1, 8, 64]  # 1, 8, 64 nearest to 1, 8, 64; step 0 kept
    for selection, message in (
        (["step3"], r"k: step3 not in the local cache \(cached: step0, .*\); fetch it first: hf download"),
        ({"stride": 2}, "k: expected all, a list of revision names, or a mapping of min_step"),
        ({"every": 0}, "k.every: expected a positive integer"),
        ({"min_step": 100}, "k: no cached revision with a step is selected"),
        ({"min_step": 64, "max_step": 8}, "k: min_step 64 is above max_step 8"),
    ):
        with pytest.raises(ValueError, match=message):
            select_revisions(revisions, selection, "k")
    twice = [*revisions, HubRevision(REPO, "stage1-step32-tokens4B", 32, 4 * 10**9, "c64")]
    with pytest.raises(ValueError, match=r"k: step64, stage1-step32-tokens4B are one commit \(c64\) but their names"):
        select_revisions(twice, "all", "k")


def test_configuration_entries_expand_to_folders(hub):
    cache, _ = hub
    suite = expand_checkpoints({"repo": REPO, "revisions": {"max_step": 2}}, "k", cache)
    assert [(c["revision"], Path(c["path"]).parent.name) for c in suite] == [
        ("step0", "snapshots"),
        ("step1", "snapshots"),
        ("step2", "snapshots"),
    ]
    listed = expand_checkpoints([{"repo": REPO, "revision": "step4", "step": 4}, {"path": "local"}], "k", cache)
    assert listed[0]["step"] == 4 and listed[1] == {"path": "local"}
    assert expand_checkpoints(listed, "k", cache) == listed  # expanded once: again, the same
    with pytest.raises(ValueError, match=r"k\[0\]: org/pythia-tiny needs its revision"):
        expand_checkpoints([{"repo": REPO}], "k", cache)
    with pytest.raises(ValueError, match=r"k: a suite is \{repo: ORG/NAME, revisions: ...\}"):
        expand_checkpoints({"repo": REPO, "revision": "step1"}, "k", cache)
    with pytest.raises(ValueError, match=r"k\[0\]: gives both path local and revision step1; a checkpoint is a folder"):
        expand_checkpoints([{"path": "local", "revision": "step1"}], "k", cache)
    with pytest.raises(ValueError, match=r"k\[0\]: gives both path .*snapshots.* and revision step2"):
        expand_checkpoints([{"repo": REPO, "revision": "step2", "path": suite[1]["path"]}], "k", cache)


def test_import_hf_takes_revisions_as_downloaded(hub, tmp_path, monkeypatch, capsys):
    """Steps from the names; tokens from tokens_per_step; the float16 .bin read as tensors and kept
    in its stored dtype; each checkpoint's repository, revision and stored dtype recorded."""
    cache, folders = hub
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # as HF_HUB_CACHE=... sets it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    argv = ["--quiet", "import-hf", REPO, "--revision", "step1", "step2", "step4", "--run-dir", "runs/suite"]
    assert main([*argv, "--config", "run.yaml", "--tokens-per-step", "1000"]) == 0
    record = json.loads(Path("runs/suite/imported.json").read_text())
    rows = [
        (c["revision"], c["step"], c["step_source"], c["tokens"], c["stored_dtypes"]) for c in record["checkpoints"]
    ]
    assert rows == [
        ("step1", 1, "revision name step1", 1000, ["float32"]),
        ("step2", 2, "revision name step2", 2000, ["float16"]),
        ("step4", 4, "revision name step4", 4000, ["float32"]),
    ]
    assert all(c["repo"] == REPO and "/snapshots/" in c["source"] for c in record["checkpoints"])
    assert "pytorch_model.bin" in record["checkpoints"][1]["files"]
    state, _ = load_weights(Path("runs/suite/epoch-001.safetensors"))
    original = torch.load(folders[2] / "pytorch_model.bin", weights_only=True)
    assert torch.equal(state["tok_embeddings.weight"], original["gpt_neox.embed_in.weight"])
    theirs = load_file(folders[4] / "model.safetensors")
    state, _ = load_weights(Path("runs/suite/epoch-002.safetensors"))
    assert torch.equal(state["output.weight"], theirs["embed_out.weight"])
    capsys.readouterr()
    assert (
        main(["--quiet", "import-hf", REPO, "--revision", "step3", "--run-dir", "runs/x", "--config", "run.yaml"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        "step3 is not in the local Hugging Face cache" in err and "hf download org/pythia-tiny --revision step3" in err
    )
    assert not Path("runs/x").exists()


def test_a_local_folder_given_as_a_repository_is_refused_by_name(tmp_path, monkeypatch):
    from tiny_llm.model.hub import cached_revisions, resolve_revision

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    for repo in ("checkpoints", "./checkpoints", str(tmp_path / "checkpoints"), "~/models"):
        with pytest.raises(ValueError, match=r"is a local folder, not a Hugging Face repository id \(owner/name\)"):
            resolve_revision(repo, "step1", tmp_path / "hf")
        with pytest.raises(ValueError, match="give checkpoint folders as paths"):
            cached_revisions(repo, tmp_path / "hf")
    with pytest.raises(ValueError, match="org/p at revision step1 is not in the local Hugging Face cache"):
        resolve_revision("org/p", "step1", tmp_path / "hf")  # a repository id: looked up in the cache
