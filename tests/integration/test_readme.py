"""The README's Python runs as written, against the demo run it names, and computes what it says."""

import re
from pathlib import Path

import torch

from tiny_llm.cli import main
from tiny_llm.curvature import EpochHessian, Precision

REPO = Path(__file__).resolve().parents[2]


def _snippets(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_readme_python_runs_against_the_demo_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    demo = str(REPO / "config/runs/demo.yaml")
    assert main(["--quiet", "prepare-data", "--config", demo]) == 0
    assert (
        main(
            [
                "--quiet",
                "train",
                "--config",
                demo,
                "--run-dir",
                "runs/demo",
                "--set",
                "training.checkpoint_policy=interval",
            ]
        )
        == 0
    )
    snippets = _snippets(REPO / "README.md")
    assert len(snippets) >= 2
    namespace: dict = {}
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), namespace)
    assert torch.isfinite(namespace["loss"]) and 1 < namespace["loss"].item() < 10
    # the quadratic forms it prints are those of an independent engine (double backward) on the same epoch
    model, tokens, V = namespace["model"], namespace["tokens"], namespace["V"]
    reference = EpochHessian(
        model,
        tokens,
        batch_size=len(tokens),
        engine="double_backward",
        precision=Precision(torch.device("cpu"), torch.float64),
        directions_per_pass=2,
    )
    torch.testing.assert_close(namespace["forms"], reference.quadratic_forms(V), rtol=1e-10, atol=0)


def test_every_python_block_of_the_docs_is_in_the_readme_or_tested():
    """Python shown anywhere in the docs is the README's (run above) or a docs page's that this test knows."""
    pages = {path.name: _snippets(path) for path in (REPO / "docs").glob("*.md")}
    assert {name for name, blocks in pages.items() if blocks} <= {"runs.md"}, pages
    readme = "\n".join(_snippets(REPO / "README.md"))
    for block in pages.get("runs.md", []):
        assert all(line in readme for line in block.splitlines() if line.strip()), block
