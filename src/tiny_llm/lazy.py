"""A package's public names, imported on first use (PEP 562), so that importing one light module of
a package (its settings, say) does not import its heavy kin (torch, the measurement code)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ALL", "exports"]

ALL = "__all__"
"""In place of a module's list of names: every name of its ``__all__`` (read from its source, not
imported)."""


def public_names(module: str) -> list[str]:
    """The names of ``module``'s ``__all__``, read from its source without importing it.

    Raises:
        ValueError: the module assigns no literal ``__all__``.
    """
    origin = importlib.util.find_spec(module).origin
    for node in ast.parse(Path(origin).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{module} has no literal __all__ to export")


def exports(package: str, where: dict[str, list[str] | str]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package`` from its modules' public names (module -> names,
    or ``ALL``: the module's own ``__all__``).

    Raises:
        ValueError: two modules export one name.
    """
    module_of: dict[str, str] = {}
    for module, names in where.items():
        for name in public_names(module) if names == ALL else names:
            if module_of.setdefault(name, module) != module:
                raise ValueError(f"{package} exports {name} from both {module_of[name]} and {module}")

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_of[name]), name)

    return sorted(module_of), __getattr__
