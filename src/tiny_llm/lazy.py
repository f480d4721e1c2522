"""A package's public names, imported on first use (PEP 562), so that importing one light module of
a package (its settings, say) does not import its heavy kin (torch, the measurement code)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["exports"]


def exports(package: str, where: dict[str, list[str]]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package`` from its modules' public names (module -> names)."""
    module_of = {name: module for module, names in where.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_of[name]), name)

    return sorted(module_of), __getattr__
