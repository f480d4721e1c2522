"""Reading a checkpoint's config.json: each value as given (0, 0.0, false and empty are values, not
absences), a value our models cannot represent refused in one line naming its key as the file
spells it (``refusal``), the RoPE section wherever transformers 4 or 5 keeps it (``rope``), and a
ModelConfig whose refusals name the file's keys (``model``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiny_llm.config import ModelConfig, RopeScaling

__all__ = ["flag", "given", "mapping", "model", "number", "positive", "refusal", "rope"]


def refusal(source: str) -> Callable[[str, Any, str], ValueError]:
    """``refuse(key, found, need)``: the one-line error for a configuration value of ``source``
    that our models cannot represent."""

    def refuse(key: str, found: Any, need: str) -> ValueError:
        return ValueError(f"{source}: {key}={found!r} cannot be represented here ({need})")

    return refuse


def given(data: dict[str, Any], *keys: str, default: Any = None) -> tuple[str, Any]:
    """(key, value) of the first of ``keys`` that ``data`` gives: 0, 0.0, false and empty are
    given, only an absent key or null is not; (the first key, ``default``) when none is."""
    for key in keys:
        if data.get(key) is not None:
            return key, data[key]
    return keys[0], default


def mapping(data: dict[str, Any], key: str, refuse: Callable[[str, Any, str], ValueError]) -> dict[str, Any]:
    """A section of a config.json that must be a mapping when given (null: empty)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise refuse(key, value, "need a mapping or null")
    return value


def positive(data: dict[str, Any], key: str, refuse: Callable[[str, Any, str], ValueError], default: Any = None) -> int:
    """A size the others are computed from, refused by name unless a positive integer."""
    value = given(data, key, default=default)[1]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise refuse(key, value, "need a positive integer")
    return value


def flag(data: dict[str, Any], key: str, default: bool) -> bool:
    """A switch of a config.json (true/false, or 0/1), refused by name when it is anything else."""
    value = given(data, key, default=default)[1]
    if value not in (True, False):  # 0 and 1 compare equal to them
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return bool(value)


def number(section: dict[str, Any], key: str, where: str, kind: type = float) -> Any:
    """``section[key]`` as a number, a value that is none named by its key."""
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or kind is int and value != int(value):
        raise ValueError(f"{where}.{key}: expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def rope(data: dict[str, Any], refuse: Callable[[str, Any, str], ValueError]) -> tuple[float, RopeScaling | None]:
    """The RoPE base and scaling, wherever transformers 4 (``rope_theta``, ``rope_scaling``) or 5
    (``rope_parameters``) keep them; scalings other than linear and llama3 refused by name."""
    parameters = mapping(data, "rope_parameters", refuse)
    where, scaling = (
        ("rope_scaling", mapping(data, "rope_scaling", refuse))
        if data.get("rope_scaling") is not None
        else ("rope_parameters", parameters)
    )
    key, theta = given({**parameters, **data}, "rope_theta", "rotary_emb_base", default=10000.0)
    theta = number({key: theta}, key, "config.json")
    if theta <= 0:
        raise refuse(key, theta, "need a positive RoPE base")
    kind = given(scaling, "rope_type", "type", default="default")[1]
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=number(scaling, "factor", where))
    if kind == "llama3":
        return theta, RopeScaling(
            kind="llama3",
            factor=number(scaling, "factor", where),
            low_freq_factor=number(scaling, "low_freq_factor", where),
            high_freq_factor=number(scaling, "high_freq_factor", where),
            original_max_seq_len=number(scaling, "original_max_position_embeddings", where, int),
        )
    raise refuse(where, scaling, "RoPE scaling of kind default, linear or llama3 only")


def model(source: str, keys: dict[str, str], **fields: Any) -> ModelConfig:
    """``ModelConfig(**fields)``; a value it refuses is named by the config.json key it came from
    (``keys``: our field -> that key)."""
    try:
        return ModelConfig(**fields)
    except ValueError as error:
        text = str(error)
        field = text.partition(":")[0].removeprefix("model.")
        if field in keys:
            text = keys[field] + text[len("model." + field) :]
        raise ValueError(f"{source}: {text}") from None
