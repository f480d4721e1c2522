"""Settings declared once: the typed loader, the same checks on values built in code, and a command
line derived from the fields that parses to the settings a configuration file loads."""

import argparse
import dataclasses
import shlex
from typing import Literal

import pytest

from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.cli import _parser
from tiny_llm.declared import add_options, build, check_fields, field_docs, from_options
from tiny_llm.geometry.settings import GeometrySettings
from tiny_llm.workers.settings import (
    AnalysisSettings,
    SpectrumSettings,
    settings_from_dict,
    spectrum_settings_from_dict,
)


@dataclasses.dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    """A rate."""


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str = "x"
    """A name."""
    count: int | None = None
    """How many (None: all)."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    flag: bool = False
    """On or off."""
    paths: tuple[str, ...] = ()
    """Some paths."""
    inner: Inner = Inner()
    """A nested section."""


def test_the_loader_refuses_by_key_and_builds_nested_sections():
    built = build(Outer, {"count": 3, "paths": ["p", "q"], "inner": {"rate": 2}}, "top.")
    assert built == Outer(count=3, paths=("p", "q"), inner=Inner(rate=2.0))
    for data, message in (
        ({"cuont": 3}, "unknown key top.cuont; allowed keys: top.name, top.count"),
        ({"count": "3"}, "top.count: expected an integer or null, got '3'"),
        ({"mode": "c"}, "top.mode: expected one of 'a', 'b', got 'c'"),
        ({"flag": 1}, "top.flag: expected true or false, got 1"),
        ({"paths": ["p", 2]}, r"top.paths\[1\]: expected a string, got 2"),
        ({"inner": {"rate": "fast"}}, "top.inner.rate: expected a number, got 'fast'"),
    ):
        with pytest.raises(ValueError, match=message):
            build(Outer, data, "top.")
    with pytest.raises(ValueError, match="mode: expected one of 'a', 'b', got 'c'"):
        check_fields(Outer(mode="c"))


def test_every_settings_class_checks_its_types_when_built_in_code_and_documents_every_field():
    for make, message in (
        (lambda: AnalysisSettings(dtype="float16"), "dtype: expected one of 'float32', 'float64'"),
        (lambda: AnalysisSettings(seed="1"), "seed: expected an integer, got '1'"),
        (lambda: AnalysisSettings(memory_budget_gb=True), "memory_budget_gb: expected a positive number or null"),
        (lambda: SpectrumSettings(lanczos_basis="half"), "spectrum.lanczos_basis: expected one of"),
        (lambda: GeometrySettings(top_k=2.5), "top_k: expected an integer, got 2.5"),
        (lambda: ClusterSettings.from_dict({"walltime": "soon"}), "cluster.walltime: expected one of"),
    ):
        with pytest.raises(ValueError, match=message):
            make()
    for cls in (AnalysisSettings, SpectrumSettings, GeometrySettings, ClusterSettings):
        docs = field_docs(cls)
        assert all(docs.get(f.name) for f in dataclasses.fields(cls)), cls.__name__


def _words(value) -> str:
    """A value as the command line spells it (the audit's on/off, every batch as all)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "all" if value is None else str(value)


def test_a_settings_file_and_the_command_line_give_the_same_settings_for_every_field(tmp_path):
    """Every field of the analysis and spectrum settings set away from its default, once in a
    configuration's terms and once as the options the command line derives from the fields."""
    analysis = dict(
        noise_samples=5, random_samples=3, seed=7, hvp_batch_size=4, directions_per_pass=2, engine="taylor",
        compile_hvp=False, device="cpu", dtype="float64", tf32=False, amp=False, consensus=False,
        block_curvature=True, sharded=True, audit=True, audit_directions=2, audit_batches=3, data_offset=1,
        memory_budget_gb=1.5, trajectory=False, preconditioned=True,
    )  # fmt: skip
    spectrum = dict(
        top_k=2, lanczos_steps=9, lanczos_tolerance=1e-4, lanczos_basis="float32", lanczos_reduction="float32",
        slq_vectors=3, slq_steps=4, block_samples=5, cg_damping=0.25, cg_rtol=1e-3, cg_max_iterations=7,
        preconditioner="next",
    )  # fmt: skip
    assert set(analysis) == {f.name for f in dataclasses.fields(AnalysisSettings)}
    assert set(spectrum) | {"sharded"} == {f.name for f in dataclasses.fields(SpectrumSettings)}
    assert all(getattr(AnalysisSettings(), k) != v for k, v in analysis.items() if k != "amp")
    argv = ["analyze-spectrum", "--run", "r", "--checkpoint", "c", "--case", "seen", "--output", "o"]
    for name, value in {**analysis, **spectrum}.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) and name not in ("audit", "preconditioned"):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, _words(value)]
    args = _parser().parse_args(shlex.split(shlex.join(argv)))
    assert from_options(AnalysisSettings, args) == settings_from_dict(analysis)
    assert from_options(SpectrumSettings, args) == spectrum_settings_from_dict({**spectrum, "sharded": True})


def test_derived_options_take_the_fields_defaults_choices_and_help():
    parser = argparse.ArgumentParser()
    add_options(parser, Outer, skip=("inner", "paths"))
    assert vars(parser.parse_args([])) == {"name": "x", "count": None, "mode": "a", "flag": False}
    assert vars(parser.parse_args(["--count", "4", "--mode", "b", "--flag"]))["count"] == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    assert "How many (None: all)." in parser.format_help()
    assert from_options(Outer, parser.parse_args(["--no-flag"])) == Outer()
