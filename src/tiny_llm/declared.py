"""Settings declared once: a frozen dataclass's fields (their types, defaults and docstrings) are
the one declaration from which a configuration file is loaded, a command line is built and parsed,
and a value built in code is checked.

* ``build(cls, data, prefix)``: the typed loader of run configurations and every settings class:
  unknown keys, types, literals and ranges refused in one line naming the key as the user spelled
  it (``prefix`` + field); nested dataclasses from mappings. A range is declared with the type:
  ``Positive`` (an integer ≥ 1), ``NonNegative``, ``PositiveNumber``, ``NonNegativeNumber``, or
  ``Annotated[int, Bounds(2)]`` and the like.
* ``check_fields(obj)``: the same checks on an instance built in code (a class's ``__post_init__``
  calls it, then writes only its cross-field checks by hand).
* ``field_docs(cls)``: each field's docstring (the string under it), for help texts.
* ``add_options(parser, cls)`` and ``from_options(cls, args)``: a command line whose options,
  defaults, choices and help come from the fields (``--name-with-dashes``; a bool is
  ``--name``/``--no-name``; a ``Literal`` gives its choices), and the instance it parsed to.

Torch-free, so the command line answers ``--help`` at once.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import math
import operator
import textwrap
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

__all__ = [
    "Bounds",
    "Items",
    "Pattern",
    "NonNegative",
    "NonNegativeNumber",
    "Positive",
    "PositiveNumber",
    "add_options",
    "build",
    "check_fields",
    "coerce",
    "describe",
    "fail",
    "field_docs",
    "from_options",
    "json_schema",
    "keywords",
    "object_schema",
    "optional_key",
    "required",
]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The range a declared number keeps: finite, at least ``low`` (above it with ``open_low``) and
    at most ``high`` (below it with ``open_high``); None: unbounded on that side."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):  # NaN compares false, infinity is no size
            return False
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def words(self, base: Any) -> str:
        """What a value in range is (``a positive integer``, ``a number in [0, 1)``)."""
        kind = "integer" if base is int else "number"
        if self.high is None and self.low == 0:
            return f"a positive {kind}" if self.open_low else f"a non-negative {kind}"
        if self.high is None and self.low == 1 and base is int:
            return "a positive integer"
        if self.high is None:
            return f"{'an' if base is int else 'a'} {kind} {'>' if self.open_low else '>='} {self.low:g}"
        return f"a {kind} in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A string a declared text keeps: it matches ``regex`` in full; ``what`` says so in words."""

    regex: str
    what: str

    def holds(self, value: str) -> bool:
        import re

        return re.fullmatch(self.regex, value) is not None

    def words(self, base: Any) -> str:
        return self.what


Positive = Annotated[int, Bounds(1)]
NonNegative = Annotated[int, Bounds(0)]
PositiveNumber = Annotated[float, Bounds(0, open_low=True)]
NonNegativeNumber = Annotated[float, Bounds(0)]


def fail(key: str, allowed: str, got: Any) -> typing.NoReturn:
    """Refuse ``got`` for ``key`` in one line: what was expected, what came."""
    raise ValueError(f"{key}: expected {allowed}, got {got!r}")


def describe(tp: Any) -> str:
    """What a value of type ``tp`` is, in the words of a refusal."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return tp.__metadata__[0].words(tp.__origin__)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if typing.get_origin(tp) in (tuple, list):
        return f"a list of {describe(typing.get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as a ``tp`` (an int as a float; a mapping as a dataclass), or refused naming ``key``.

    Raises:
        ValueError: ``key: expected <what tp is>, got <value>``.
    """
    origin = typing.get_origin(tp)
    if origin is Annotated:
        value = coerce(value, tp.__origin__, key)
        if all(bound.holds(value) for bound in tp.__metadata__):
            return value
    elif origin is Literal:
        if value in typing.get_args(tp) and isinstance(value, type(typing.get_args(tp)[0])):
            return value
    elif origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        arms = [arm for arm in typing.get_args(tp) if arm is not type(None)]
        if len(arms) == 1 and dataclasses.is_dataclass(arms[0]) and isinstance(value, dict):
            return coerce(value, arms[0], key)  # a section or null: the section's own refusal names its key
        for arm in arms:
            try:
                return coerce(value, arm, key)
            except ValueError:
                continue
        fail(key, describe(tp), value)
    elif origin in (tuple, list):
        if isinstance(value, (tuple, list)):
            return origin(coerce(item, typing.get_args(tp)[0], f"{key}[{i}]") for i, item in enumerate(value))
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            return build(tp, value, key + ".")
        if isinstance(value, tp):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    fail(key, describe(tp), value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """``cls`` from plain data: every key a field (refused by name otherwise, listing the allowed
    ones), every value of its field's type; missing keys take the defaults.

    Raises:
        ValueError: an unknown key or a value of the wrong type, naming ``prefix`` + the key.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ValueError(f"unknown key {prefix}{key}; allowed keys: {', '.join(prefix + n for n in names)}")
    hints = _hints(cls)
    return cls(**{name: coerce(data[name], hints[name], prefix + name) for name in names if name in data})


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of a dataclass instance against its declared type (what ``build`` checks
    of loaded data, for a value built in code).

    Raises:
        ValueError: the first field whose value is not of its type, naming ``prefix`` + the field.
    """
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        coerce(getattr(obj, field.name), hints[field.name], prefix + field.name)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right below it in the class body), whitespace
    folded; the fields of base classes too."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip: tuple[str, ...] = (),
    parsers: dict[str, Callable[[str], Any]] | None = None,
) -> None:
    """One option per field of ``cls`` (but ``skip``): ``--field-name``, its default the field's,
    its help the field's docstring; a bool ``--name``/``--no-name``; a ``Literal`` its choices;
    ``parsers`` a field's own text parser (``all`` for None, say) in place of its type's."""
    hints, docs, parsers = _hints(cls), field_docs(cls), parsers or {}
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        help_text = docs.get(field.name, "").replace("``", "")  # the docstring's markup is not the terminal's
        tp, options = hints[field.name], {"dest": field.name, "default": field.default, "help": help_text}
        arms = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        arms = [a.__origin__ if typing.get_origin(a) is Annotated else a for a in arms]
        if field.name in parsers:
            options["type"] = parsers[field.name]
        elif tp is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(tp) is Literal:
            options["choices"] = typing.get_args(tp)
        elif arms[0] in (int, float, str):
            options["type"] = arms[0]
        parser.add_argument(_flag(field.name), **options)


def from_options(cls: type, args: argparse.Namespace) -> Any:
    """The ``cls`` that ``add_options``' options parsed to (checked as ``build`` checks data),
    naming a refused value by its flag."""
    data = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    hints = _hints(cls)
    return cls(**{name: coerce(value, hints[name], _flag(name)) for name, value in data.items()})


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _type_schema(tp: Any, spelled: str | None) -> dict[str, Any]:
    """The JSON schema of values of ``tp`` (``spelled``: the word a configuration writes for None)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        schema = _type_schema(tp.__origin__, None)
        for mark in tp.__metadata__:
            if isinstance(mark, Pattern):
                schema["pattern"] = mark.regex
                continue
            if mark.low is not None:
                schema["exclusiveMinimum" if mark.open_low else "minimum"] = mark.low
            if mark.high is not None:
                schema["exclusiveMaximum" if mark.open_high else "maximum"] = mark.high
        return schema
    if origin is Literal:
        values = list(typing.get_args(tp))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (typing.Union, types.UnionType):
        arms = [_type_schema(arm, None) for arm in typing.get_args(tp) if arm is not type(None)]
        if type(None) in typing.get_args(tp):
            if spelled is not None:
                arms.append({"type": "string", "enum": [spelled]})
            elif len(arms) == 1 and isinstance(arms[0].get("type"), str):
                return {**arms[0], "type": [arms[0]["type"], "null"]}
            else:
                arms.append({"type": "null"})
        return {"oneOf": arms}
    if origin is tuple:  # tuple[T, ...]: a list of T
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0], None)}
    if tp is Any:  # passed on as written (a mapping its reader checks)
        return {}
    return {"type": _JSON_TYPES[tp]}


def required(cls: type) -> list[str]:
    """The fields of ``cls`` without a default: a configuration must give them."""
    missing = dataclasses.MISSING
    return [f.name for f in dataclasses.fields(cls) if f.default is missing and f.default_factory is missing]


def json_schema(cls: type, spelled: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each field of ``cls`` as a JSON-schema property: its type (a ``Literal`` as an enum, a range
    as minimum/maximum, a pattern), its default and its docstring as the description. ``spelled``:
    field → the word a configuration writes for its None (``all``), which is then its default's
    spelling too. (The properties of ``object_schema``.)"""
    return object_schema(cls, spelled=spelled)["properties"]


def keywords(**given: Any) -> dict[str, Any]:
    """A field's ``metadata`` for ``object_schema``: JSON-schema keywords its schema adds or replaces
    (``minItems=2``, ``default={}``), and ``unset=True`` for a key a configuration may leave out but
    never gives as null (no default is written, and None is not one of its values)."""
    return {"schema": given}


@dataclasses.dataclass(frozen=True)
class Items:
    """An array's bounds, for ``Annotated[tuple[X, ...], Items(1)]``: at least ``least`` items, and
    all different with ``unique``."""

    least: int = 0
    unique: bool = False

    def keywords(self) -> dict[str, Any]:
        return {"minItems": self.least} | ({"uniqueItems": True} if self.unique else {})


def optional_key(**given: Any) -> Any:
    """A dataclass field for a key a configuration may leave out but never gives as null (default
    None in code; no default in the schema), with ``keywords`` ``given``."""
    return dataclasses.field(default=None, metadata=keywords(unset=True, **given))


def object_schema(
    cls: type, defs: dict[str, Any] | None = None, spelled: dict[str, str] | None = None
) -> dict[str, Any]:
    """The JSON schema of a configuration section or entry declared by dataclass ``cls``: an object
    of its fields and no others, those without a default required, each field's schema from its
    type (``_value_schema``) with its default, its docstring as the description and its metadata's
    keywords (``keywords``); the class's ``__schema__`` keywords are added to the object. A nested
    dataclass with a ``__schema_ref__`` name is written once under ``defs`` and referred to.
    ``spelled``: field → the word a configuration writes for its None (as ``json_schema``)."""
    hints, docs, spelled = _hints(cls), field_docs(cls), spelled or {}
    properties, needed = {}, []
    for field in dataclasses.fields(cls):
        extra = dict(field.metadata.get("schema", {}))
        unset, nested = extra.pop("unset", False), extra.pop("spelled", None)
        tp = hints[field.name]
        if unset or "default" in extra:  # None is the code's absence, not a value to write
            tp = _without_none(tp)
        word = spelled.get(field.name)
        schema = _type_schema(tp, word) if word else _value_schema(tp, defs, nested)
        if field.default is not dataclasses.MISSING and not unset:
            default = list(field.default) if isinstance(field.default, tuple) else field.default
            schema["default"] = word if default is None and word else default
        elif field.default_factory is not dataclasses.MISSING:
            schema["default"] = field.default_factory()
        elif not unset:
            needed.append(field.name)
        schema.update(extra)
        if field.name in docs:
            schema["description"] = docs[field.name].replace("``", "")
        properties[field.name] = schema
    required_ = {"required": needed} if needed else {}
    return {"type": "object", "additionalProperties": False, **required_, "properties": properties,
            **getattr(cls, "__schema__", {})}  # fmt: skip


def _without_none(tp: Any) -> Any:
    arms = [arm for arm in typing.get_args(tp) if arm is not type(None)]
    if typing.get_origin(tp) not in (typing.Union, types.UnionType) or len(arms) == len(typing.get_args(tp)):
        return tp
    return functools.reduce(operator.or_, arms)


def _value_schema(tp: Any, defs: dict[str, Any] | None, spelled: Any = None) -> dict[str, Any]:
    """The JSON schema of values of ``tp``: a dataclass as its object (``object_schema``; ``spelled``:
    its fields' words for None, as ``json_schema``), ``dict[str, X]`` as an object of X values,
    ``tuple[X, ...]`` as an array of them, a union as one of its arms, anything else as
    ``_type_schema`` writes it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated and any(isinstance(mark, Items) for mark in tp.__metadata__):
        marks = [mark for mark in tp.__metadata__ if not isinstance(mark, Items)]
        schema = _value_schema(Annotated[(tp.__origin__, *marks)] if marks else tp.__origin__, defs)
        for mark in tp.__metadata__:
            schema.update(mark.keywords() if isinstance(mark, Items) else {})
        return schema
    if dataclasses.is_dataclass(tp):
        schema = object_schema(tp, defs, spelled)
        name = getattr(tp, "__schema_ref__", None)
        if name is None or defs is None:
            return schema
        defs[name] = {"description": " ".join(inspect.getdoc(tp).split()), **schema}
        return {"$ref": f"#/$defs/{name}"}
    if origin is dict:
        return (
            {"type": "object"}
            if args[1] is Any
            else {"type": "object", "additionalProperties": _value_schema(args[1], defs)}
        )
    if origin is tuple and args and not any(dataclasses.is_dataclass(a) for a in args):
        return _type_schema(tp, None)
    if origin is tuple:
        return {"type": "array", "items": _value_schema(args[0], defs)}
    if origin in (typing.Union, types.UnionType) and not all(map(_scalar, args)):
        return {"oneOf": [_value_schema(arm, defs) if arm is not type(None) else {"type": "null"} for arm in args]}
    return _type_schema(tp, None)


def _scalar(tp: Any) -> bool:
    """Whether ``_type_schema`` writes ``tp`` alone: a number, string, bool, None, a literal, or one of
    them with bounds or a pattern."""
    if typing.get_origin(tp) is Annotated:
        return all(not isinstance(mark, Items) for mark in tp.__metadata__) and _scalar(tp.__origin__)
    return tp in _JSON_TYPES or tp is type(None) or typing.get_origin(tp) is Literal
