"""An output directory's binding: checked without writing, recorded after the same check, and a
change refused by name once it holds results."""

import json

import pytest

from tiny_llm.workers.binding import bind_output, check_output_binding, output_binding
from tiny_llm.workers.settings import AnalysisSettings


def test_output_binding_names_what_changed_and_the_way_out(tmp_path, caplog):
    binding = output_binding(AnalysisSettings(), "runs/demo")
    assert check_output_binding(tmp_path, binding) == [] and not (tmp_path / "identity.json").exists()  # no write
    bind_output(tmp_path, binding)
    assert check_output_binding(tmp_path, binding) == []  # the same binding: accepted
    # a first attempt that made no result does not lock the name: the binding follows the settings
    fixed = output_binding(AnalysisSettings(device="cpu"), "runs/demo")
    assert check_output_binding(tmp_path, fixed) == ["settings.device: 'auto' -> 'cpu'"]
    assert json.loads((tmp_path / "identity.json").read_text()) == binding  # the check wrote nothing
    with caplog.at_level("INFO"):
        bind_output(tmp_path, fixed)
    assert json.loads((tmp_path / "identity.json").read_text()) == fixed
    assert (
        "held no result yet: its binding now follows the changed settings (settings.device: 'auto' -> 'cpu')"
        in caplog.text
    )
    binding = fixed
    (tmp_path / "states/abc").mkdir(parents=True)
    (tmp_path / "states/abc/seen.json").write_text("{}")
    with pytest.raises(
        ValueError,
        match=rf"settings.seed: 42 -> 7\); use a new output directory \(a new analysis "
        rf"name\), restore the settings, or remove {tmp_path} \(its results\)",
    ):
        check_output_binding(tmp_path, output_binding(AnalysisSettings(seed=7, device="cpu"), "runs/demo"))
    with pytest.raises(ValueError, match=rf"source code changed\); use a new analysis name, or remove {tmp_path}"):
        check_output_binding(tmp_path, {**binding, "source": "other"})
