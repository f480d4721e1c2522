"""The frozen copy of tiny_llm that every job of a workflow run imports."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tiny_llm
from tiny_llm.provenance import freeze_source, source_hash

PACKAGE = Path(tiny_llm.__file__).resolve().parent


def _freeze_from(source: Path, root: Path) -> tuple[Path, str, str]:
    """freeze_source run by the tiny_llm under ``source`` (a fresh process); then what a process
    with the frozen copy first on PYTHONPATH imports: (frozen dir, its tiny_llm file, its hash)."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    frozen = Path(
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from tiny_llm.provenance import freeze_source; print(freeze_source({str(root)!r}))",
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    env["PYTHONPATH"] = f"{frozen}{os.pathsep}{source}"
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tiny_llm, tiny_llm.provenance as p; print(tiny_llm.__file__); print(p.source_hash())",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return frozen, imported[0], imported[1]


def test_the_copy_holds_every_source_file_unchanged(tmp_path):
    frozen = freeze_source(tmp_path / "frozen")
    files = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    assert sorted(p.relative_to(frozen / "tiny_llm") for p in (frozen / "tiny_llm").rglob("*.py")) == files
    assert all((frozen / "tiny_llm" / f).read_bytes() == (PACKAGE / f).read_bytes() for f in files)
    assert freeze_source(tmp_path / "frozen") == frozen  # the same code: the same copy, made once
    assert [p.name for p in (tmp_path / "frozen").iterdir()] == [frozen.name]  # no staging left


def test_jobs_import_the_copy_made_at_the_start_whatever_happens_to_the_checkout(tmp_path):
    checkout = tmp_path / "src"
    shutil.copytree(PACKAGE, checkout / "tiny_llm", ignore=shutil.ignore_patterns("__pycache__"))
    frozen, imported, digest = _freeze_from(checkout, tmp_path / "frozen")
    assert Path(imported).parent == frozen / "tiny_llm" and digest == source_hash()
    noise = checkout / "tiny_llm/curvature/noise.py"
    noise.write_text(noise.read_text() + "\n# edited\n")
    # the frozen copy still imports the old code; a new run freezes the new code elsewhere
    env = {**os.environ, "PYTHONPATH": f"{frozen}{os.pathsep}{checkout}"}
    again = subprocess.run(
        [sys.executable, "-c", "import tiny_llm.provenance as p; print(p.source_hash())"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert again == source_hash()
    edited, _, edited_digest = _freeze_from(checkout, tmp_path / "frozen")
    assert edited != frozen and edited_digest != source_hash()


def test_the_copy_goes_first_on_pythonpath_once(monkeypatch, tmp_path):
    from tiny_llm.provenance import use_frozen_source

    monkeypatch.setenv("PYTHONPATH", f"/elsewhere{os.pathsep}")
    frozen = use_frozen_source(tmp_path / "frozen")
    assert use_frozen_source(tmp_path / "frozen") == frozen
    assert os.environ["PYTHONPATH"] == f"{frozen}{os.pathsep}/elsewhere"


def _hash_of(source: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(source)}
    return subprocess.run(
        [sys.executable, "-c", "import tiny_llm.provenance as p; print(p.source_hash())"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_the_source_hash_covers_every_numerical_wing_and_nothing_else(tmp_path):
    from tiny_llm.provenance import numerical_files

    files = {path.relative_to(PACKAGE).as_posix() for path in numerical_files(PACKAGE)}
    assert {
        "config.py",
        "model/jets.py",
        "curvature/spectrum.py",
        "workers/state.py",
        "training/loop.py",
        "data/tokens.py",
    } <= files
    assert not any(name.startswith(("results/", "campaign/", "geometry/", "cli")) for name in files)
    checkout = tmp_path / "src"
    shutil.copytree(PACKAGE, checkout / "tiny_llm", ignore=shutil.ignore_patterns("__pycache__"))
    assert _hash_of(checkout) == source_hash()
    figures = checkout / "tiny_llm/results/figures.py"
    figures.write_text(figures.read_text() + "\n# a figure edited\n")
    assert _hash_of(checkout) == source_hash()
    jets = checkout / "tiny_llm/model/jets.py"
    jets.write_text(jets.read_text() + "\n# a jet rule edited\n")
    assert _hash_of(checkout) != source_hash()
