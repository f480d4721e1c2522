"""The configuration's reference is generated: the whole workflow schema and the key tables of
docs/workflow.md and docs/critical-batch.md are what the declarations write, a declaration's
nested sections, entries, optional keys and array bounds become their schema, and the schema refuses
what the settings refuse."""

import dataclasses
from typing import Annotated, Any, Literal

import jsonschema
import pytest
import yaml

from tiny_llm.campaign.settings_reference import DOCS, REPO, SCHEMA, SECTIONS, check, docs_table, render
from tiny_llm.declared import Bounds, Items, Pattern, Positive, PositiveNumber, json_schema, object_schema, optional_key
from tiny_llm.workers.settings import AnalysisSettings


def test_the_checked_in_schema_and_docs_are_what_the_declarations_write():
    assert check() == [], "run python -m tiny_llm.campaign.settings_reference --write"


def test_a_declaration_becomes_its_schema():
    @dataclasses.dataclass(frozen=True)
    class Example:
        count: Positive | None = None
        """How many (all: every one)."""
        rate: PositiveNumber = 0.5
        kind: Literal["a", "b"] = "a"
        name: Annotated[str, Pattern("x+", "some x")] = "x"
        share: Annotated[float, Bounds(0, 1, open_high=True)] = 0.0
        flag: bool | Literal["auto"] = "auto"

    schema = json_schema(Example, {"count": "all"})
    assert schema["count"] == {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "enum": ["all"]}],
        "default": "all",
        "description": "How many (all: every one).",
    }
    assert schema["rate"] == {"type": "number", "exclusiveMinimum": 0, "default": 0.5}
    assert schema["kind"] == {"type": "string", "enum": ["a", "b"], "default": "a"}
    assert schema["name"] == {"type": "string", "pattern": "x+", "default": "x"}
    assert schema["share"] == {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.0}
    assert schema["flag"]["oneOf"] == [{"type": "boolean"}, {"type": "string", "enum": ["auto"]}]
    assert json_schema(Example)["count"]["type"] == ["integer", "null"]


def test_a_generated_part_is_rewritten_from_its_markers_and_a_missing_marker_is_refused():
    text, on_page = "before\n", [section for section in SECTIONS if section.docs == DOCS]
    for section in on_page:
        name = section.cls.__name__
        text += (
            f"<!-- BEGIN generated from {name} (python -m tiny_llm.campaign.settings_reference --write) -->\nSTALE\n"
        )
        text += f"<!-- END generated from {name} -->\nbetween\n"
    rendered = render(DOCS, text)
    assert all(docs_table(section) in rendered for section in on_page)
    assert "STALE" not in rendered and rendered.count("between") == len(on_page)
    with pytest.raises(ValueError, match="expected one line each"):
        render(DOCS, "no markers here\n")


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [("device", "cuda:1", True), ("device", "gpu", False), ("audit", "on", True), ("noise_samples", "all", True)],
)
def test_the_schema_refuses_what_the_settings_refuse(key, value, valid):
    schema = yaml.safe_load((REPO / SCHEMA).read_text())
    settings = schema["properties"]["analyses"]["additionalProperties"]["properties"]["settings"]
    errors = list(jsonschema.Draft202012Validator(settings).iter_errors({key: value}))
    assert (not errors) == valid
    data = {key: None if value == "all" else value}
    if valid:
        AnalysisSettings(**data)
    else:
        with pytest.raises(ValueError, match=key):
            AnalysisSettings(**data)


def test_the_cluster_section_is_generated_and_refuses_what_its_settings_refuse():
    from tiny_llm.campaign.plan import ClusterSettings

    schema = yaml.safe_load((REPO / SCHEMA).read_text())["properties"]["cluster"]
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(ClusterSettings)}
    validator = jsonschema.Draft202012Validator(schema)
    for data, valid in [({"walltime_hours": 72}, True), ({"walltime_hours": 73}, False),
                        ({"states_per_job": "auto"}, True), ({"timing_profiles": ["a"]}, True)]:  # fmt: skip
        assert (not list(validator.iter_errors(data))) == valid, data
        if not valid:
            with pytest.raises(ValueError, match="cluster.walltime_hours: expected a number in"):
                ClusterSettings.from_dict(data)


def test_the_schema_refuses_a_cbs_experiment_the_declaration_refuses():
    """The cbs_experiments entry of the schema is its dataclass's: an unknown or missing key and a
    value out of range are refused by the schema too."""
    schema = yaml.safe_load((REPO / SCHEMA).read_text())
    entry = jsonschema.Draft202012Validator(schema["properties"]["cbs_experiments"]["additionalProperties"])
    good = {"config": "c.yaml", "checkpoints": [1], "batch_sizes": [2, 4], "token_budget": 64}
    assert not list(entry.iter_errors(good))
    for bad in ({**good, "lr_rul": "sqrt"}, {k: v for k, v in good.items() if k != "token_budget"},
                {**good, "epsilon": 0}, {**good, "lr_rule": "cubic"}):  # fmt: skip
        assert list(entry.iter_errors(bad)), bad


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Leaf:
    """A referred definition."""

    __schema_ref__ = "leaf"

    name: str
    """Its name."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Entry:
    __schema__ = {"minProperties": 1}

    needed: str
    note: str | None = optional_key()
    """Left out, or a string (never null)."""
    tags: Annotated[tuple[str, ...], Items(1, unique=True)] = ()
    choice: Literal["all"] | Annotated[tuple[str, ...], Items(1)] | _Leaf = "all"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Top:
    entries: dict[str, _Entry] = dataclasses.field(default_factory=dict)
    """Entries by name."""


def test_a_nested_declaration_becomes_its_schema():
    defs = {}
    top = object_schema(_Top, defs)
    entry = top["properties"]["entries"]["additionalProperties"]
    assert top["properties"]["entries"]["default"] == {} and entry["additionalProperties"] is False
    assert entry["required"] == ["needed"] and entry["minProperties"] == 1
    assert entry["properties"]["note"] == {"type": "string", "description": "Left out, or a string (never null)."}
    assert entry["properties"]["tags"] == {
        "type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True, "default": []
    }  # fmt: skip
    assert entry["properties"]["choice"]["oneOf"] == [
        {"type": "string", "enum": ["all"]},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {"$ref": "#/$defs/leaf"},
    ]
    assert defs["leaf"]["required"] == ["name"] and defs["leaf"]["description"] == "A referred definition."
    validator = jsonschema.Draft202012Validator({**top, "$defs": defs})
    assert not list(validator.iter_errors({"entries": {"a": {"needed": "x", "choice": {"name": "n"}}}}))
    for bad in ({"needed": "x", "note": None}, {"note": "x"}, {"needed": "x", "tags": []}, {"needed": "x", "z": 1}):
        assert list(validator.iter_errors({"entries": {"a": bad}})), bad


@pytest.mark.parametrize(
    "path",
    [
        "config/config.yaml",
        "config/cbs-demo.yaml",
        "config/cbs-study.yaml",
        "config/seeds-demo.yaml",
        "config/naiss.yaml",
    ],
)
def test_the_projects_configurations_are_valid_under_the_generated_schema(path):
    schema = yaml.safe_load((REPO / SCHEMA).read_text())
    config = yaml.safe_load((REPO / path).read_text()) or {}
    assert not [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(config)]
