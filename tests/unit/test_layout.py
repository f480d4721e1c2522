"""The file layout of runs and analyses: checkpoint names that the pattern reads back, result paths
that are the workflow rules' output patterns, and names the figures' modules draw."""

from pathlib import Path

from tiny_llm import layout
from tiny_llm.results import figures, spectrum_figures

RULES = Path(__file__).resolve().parents[2] / "workflow/rules"


def test_checkpoint_names_are_read_back_by_their_pattern():
    assert [layout.epoch_file(e) for e in (0, 7, 1234)] == [
        "epoch-000.safetensors",
        "epoch-007.safetensors",
        "epoch-1234.safetensors",
    ]
    assert [int(layout.EPOCH_FILE.match(layout.epoch_file(e)).group(1)) for e in (0, 7, 1234)] == [0, 7, 1234]
    assert layout.EPOCH_FILE.match("epoch-001.pt") is None and layout.EPOCH_FILE.match("xepoch-001.safetensors") is None
    assert layout.state_file(3) == "state-003.pt" and layout.epoch_stem(12) == "epoch-012"


def test_result_paths_are_the_rules_output_patterns():
    assert layout.state_result("demo", "ab", "seen") == "results/demo/states/ab/seen.json"
    rules = "\n".join(p.read_text() for p in RULES.glob("*.smk"))
    for pattern in (layout.STATE_RESULT, layout.STATE_DONE, layout.SPECTRUM_RESULT):
        assert f'"{pattern}"' in rules, pattern


def test_the_figure_lists_are_what_the_figure_modules_draw():
    assert spectrum_figures.SPECTRUM_FIGURES is layout.SPECTRUM_FIGURES
    drawn = {name.removeprefix("_") for name in vars(figures) if callable(vars(figures)[name])}
    missing = [
        name for name in layout.FIGURES + layout.AUDIT_FIGURES if name not in drawn and f"plot_{name}" not in drawn
    ]
    assert not missing, missing
