"""A registry's entry by name (an unknown one refused naming the setting and the known names), and
the code an entry names imported when used."""

import math

import pytest

from tiny_llm.registry import load, named


def test_an_entry_is_found_by_name_and_an_unknown_one_refused_by_its_setting():
    registry = {"taylor": 1, "adjoint": 2}
    assert named(registry, "adjoint", "engine") == 2
    for bad in ("nope", None, ["taylor"]):
        with pytest.raises(ValueError, match=r"^engine: expected one of taylor, adjoint, got "):
            named(registry, bad, "engine")


def test_the_code_an_entry_names_is_imported_when_used():
    assert load("math:sqrt") is math.sqrt
    with pytest.raises(AttributeError):
        load("math:no_such_name")
