"""What the registries (architectures, curvature engines) share: an entry found by name, refused in
one line naming the setting and the known names, and the code an entry names as ``module:attribute``
imported only when it is used, so that a registry imports no torch.

Example:
    >>> named({"a": 1, "b": 2}, "b", "model.kind")
    2
    >>> load("math:pi") > 3
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["load", "named"]

T = TypeVar("T")


def named(registry: Mapping[str, T], name: Any, key: str) -> T:
    """The entry of ``registry`` called ``name``.

    Raises:
        ValueError: an unknown name: ``key`` (the setting that gave it) and the known ones.
    """
    try:
        return registry[name]
    except (KeyError, TypeError):
        raise ValueError(f"{key}: expected one of {', '.join(registry)}, got {name!r}") from None


def load(target: str) -> Any:
    """The attribute ``target`` (``module:attribute``) names, its module imported now."""
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)
