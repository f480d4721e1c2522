"""A published suite on its own training order through the workflow: revisions in a local Hugging
Face cache (``main`` beside the steps, as downloaded), the order as a Megatron indexed dataset, an
analysis with seen, unseen and recent; the workflow imports, checks, measures, collects and draws,
each case on its window of training steps, and a rerun does nothing. In the same run, the README's
Pythia example as written, on a miniature Pythia (1,024 sequences a step) in the same cache; and
docs/suites.md's example planned."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_hub import RUN_YAML, ordered_suite

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def _snakemake(workdir: Path, *extra: str, hub: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub or workdir / "hf"), "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    command = [str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / "config.yaml"), "-c2", *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _example(page: str, marker: str) -> str:
    """The yaml block of ``page`` that holds ``marker``, as written."""
    return next(b for b in re.findall(r"```yaml\n(.*?)```", (REPO / page).read_text(), re.S) if marker in b)


def _miniature_pythia(root: Path) -> None:
    """EleutherAI/pythia-160m in miniature (9-token sequences, 1,024 a step; step0, 1, 2, 4 and
    main) in ``root/hf``, its order at data/pile/document, and docs/suites.md's run configuration
    with the miniature's sequence length."""
    ordered_suite(
        root / "pythia", 1024, 6, (0, 1, 2, 4), repo="EleutherAI/pythia-160m", data=root / "data/pile/document"
    )
    name = "models--EleutherAI--pythia-160m"
    shutil.copytree(root / "pythia/hf" / name, root / "hf" / name, symlinks=True)
    run = _example("docs/suites.md", "# pythia-run.yaml")
    assert "seq_len: 2048" in run
    (root / "pythia-run.yaml").write_text(run.replace("seq_len: 2048", "seq_len: 8"))


def _two_more_seeds(root: Path, analysis: dict) -> dict:
    """Seeds 1 and 2 of the ordered suite (own initialisation and data order) in the same cache,
    and an analysis of each measuring seen."""
    analyses = {}
    for seed in (1, 2):
        repo, folder = f"org/ordered-s{seed}", root / f"seed{seed}"
        ordered_suite(folder, per_step=2, steps=10, saved=(2, 4, 6), seed=seed, repo=repo, data=root / f"doc-s{seed}")
        name = f"models--org--ordered-s{seed}"
        shutil.copytree(folder / "hf" / name, root / "hf" / name, symlinks=True)
        analyses[f"ordered-s{seed}"] = {
            **{k: v for k, v in analysis.items() if k not in ("spectrum", "cache_inputs")},
            "hf_checkpoints": {"repo": repo, "revisions": "all"},
            "training_order": {**analysis["training_order"], "path": f"doc-s{seed}"},
            "cases": ["seen"],
        }
    return analyses


def test_a_suite_on_its_training_order_through_the_workflow(tmp_path):
    ordered_suite(tmp_path, per_step=2, steps=10, saved=(2, 4, 6))
    _miniature_pythia(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML.replace("cache/p", "cache/ordered"))
    (tmp_path / "a.txt").write_text("a reference text the offset case would read " * 300)
    settings = {"device": "cpu", "dtype": "float64", "noise_samples": 2, "random_samples": 2, "directions_per_pass": 2}
    analysis = {
        "config": "run.yaml",
        "hf_checkpoints": {"repo": "org/ordered", "revisions": "all"},
        "tokens_per_step": 16,
        "cache_inputs": ["a.txt"],
        "training_order": {"path": "document", "format": "megatron", "sequences_per_step": 2},
        "case_steps": 2,
        "cases": ["seen", "unseen", "recent", "step"],
        "settings": settings,
        "spectrum": {"enabled": True, "top_k": 1, "lanczos_steps": 20, "slq_vectors": 1, "slq_steps": 4},
    }
    readme = yaml.safe_load(_example("README.md", "pythia-160m:"))["analyses"]
    seeds = _two_more_seeds(tmp_path, analysis)  # a study across three seeds of the suite
    study = {"ordered-seeds": {"analyses": ["ordered", *seeds]}}
    config = {"analyses": {"ordered": analysis, **seeds, **readme}, "seed_studies": study, "plots": {}}
    config["settings_override"] = {"random_samples": 2, "audit": False}  # a short test; the entries as written
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = _snakemake(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "note: analyses.ordered.hf_checkpoints: main is the same commit as step6: measured once" in done.stderr
    assert "note: analyses.pythia-160m.hf_checkpoints: step0 left out" in done.stderr
    pythia = list(csv.DictReader((tmp_path / "results/pythia-160m/summary.csv").open()))
    assert [(r["source"], r["case"]) for r in pythia] == [
        (f"step{s}", c) for s in (1, 2, 4) for c in ("seen", "unseen", "recent")
    ]
    assert all(float(r["b_simple"]) > 0 and float(r["mean_noise_norm"]) > 0 for r in pythia)  # 8 noise batches
    sizes = json.loads((tmp_path / "results/pythia-160m/manifest.json").read_text())["batch_sizes"]["seen"]
    assert (sizes["training_batch_size"], sizes["effective_batch_size"], sizes["epoch_batches"]) == (1024, 128, 8)
    rows = list(csv.DictReader((tmp_path / "results/ordered/summary.csv").open()))
    assert [(r["source"], r["case"]) for r in rows] == [
        (f"step{s}", c) for s in (2, 4, 6) for c in ("seen", "unseen", "recent", "step")
    ]
    # The price line describes the job that ran: the window's batches, not the run's epoch, and the spectra.
    first = json.loads((tmp_path / f"results/ordered/states/{rows[0]['state_key']}/seen.json").read_text())
    price = re.search(r"analysis ordered: [^\n]*", done.stderr).group(0)
    counts = first["counts"]
    assert f"{counts['hvp_passes']} passes × {counts['hvp_batches']} curvature micro-batches" in price
    assert f"spectra: ≤ {20 + 1 * 4 + 2 * 2 + 50} Hessian-vector products per (state, case)" in price  # no P here
    assert "this setup on cpu" in price and "the GPU's free memory" not in price  # no timing entry here
    windows = {
        r["source"]: json.loads((tmp_path / f"results/ordered/states/{r['state_key']}/step.json").read_text())
        for r in rows
        if r["case"] == "step"
    }
    assert {k: (v["data"]["window"]["first_step"], v["data"]["window"]["last_step"]) for k, v in windows.items()} == {
        "step2": (3, 4),  # the steps from each checkpoint to the next: the batches its step trained on
        "step4": (5, 6),
        "step6": (7, 8),  # the last: the case_steps steps after it
    }
    assert all(float(r["step_curvature"]) > 0 for r in rows if r["case"] == "step" and r["source"] != "step6")
    loss = {(r["source"], r["case"]): float(r["loss"]) for r in rows}
    assert loss["step2", "seen"] == loss["step2", "recent"]  # at the earliest checkpoint both are steps 1..2
    assert loss["step6", "recent"] < loss["step6", "seen"] < loss["step6", "unseen"]  # last trained, long ago, never
    across = list(csv.DictReader((tmp_path / "results/ordered-seeds/seeds.csv").open()))
    assert [(r["case"], r["step"], r["seeds"]) for r in across if r["case"] == "seen"] == [
        ("seen", str(s), "3") for s in (2, 4, 6)
    ]
    seen = {
        name: {
            r["step"]: float(r["loss"])
            for r in csv.DictReader((tmp_path / f"results/{name}/summary.csv").open())
            if r["case"] == "seen"
        }
        for name in study["ordered-seeds"]["analyses"]
    }
    for row in (r for r in across if r["case"] == "seen"):
        losses = [seen[name][row["step"]] for name in seen]
        assert float(row["loss_mean"]) == pytest.approx(sum(losses) / 3, rel=1e-12)
        assert float(row["loss_min"]) == min(losses) and float(row["loss_max"]) == max(losses)
    assert (tmp_path / "results/ordered-seeds/figures/seeds.png").stat().st_size > 10_000
    spectra = list(csv.DictReader((tmp_path / "results/ordered/spectrum.csv").open()))
    assert len(spectra) == 12 and all(float(r["la_eigenvalue_1"]) > 0 for r in spectra)  # on each case's window
    manifest = json.loads((tmp_path / "results/ordered/manifest.json").read_text())
    assert manifest["data"]["seen"]["window"] == {"first_step": 1, "last_step": 2, "steps": 2}
    assert manifest["data"]["unseen"]["window"] == {"first_step": 7, "last_step": 8, "steps": 2}
    assert manifest["integrity"]["checked"] == 3 and manifest["integrity"]["flagged"] == []
    assert all(r["integrity"] == "" for r in rows)
    again = _snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    changed = yaml.safe_load((tmp_path / "config.yaml").read_text())
    changed["analyses"]["ordered"]["case_steps"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(changed))
    refused = _snakemake(tmp_path)
    assert refused.returncode == 2 and "case_steps: 2 -> 1" in refused.stderr, refused.stderr[-2000:]
    docs = tmp_path / "docs-example"  # docs/suites.md's example plans on the same cache and order
    docs.mkdir()
    (docs / "data").symlink_to(tmp_path / "data")
    shutil.copyfile(tmp_path / "pythia-run.yaml", docs / "pythia-run.yaml")
    (docs / "config.yaml").write_text(_example("docs/suites.md", "batch_sequences: 256"))
    planned = _snakemake(docs, "-n", hub=tmp_path / "hf")
    assert planned.returncode == 0 and "3 states" in planned.stderr + planned.stdout, planned.stderr[-2000:]
