"""What one job runs: the (state, case) analysis (state), the spectrum of a state (spectrum), and
the index of a run's checkpoints into unique parameter states (index). Each writes one result
file atomically, bound to its settings identity.

Names are imported on first use, so that the torch-free settings (``workers.settings``) can be
imported alone, by the command line among others.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(["check_output_binding", "output_binding"], "tiny_llm.workers.binding"),
    **dict.fromkeys(["check_selection", "index_states", "select_checkpoints"], "tiny_llm.workers.index"),
    **dict.fromkeys(["LoadedState", "load_state", "resolve_checkpoints"], "tiny_llm.workers.loading"),
    **dict.fromkeys(
        [
            "AnalysisSettings",
            "CASES",
            "SpectrumSettings",
            "quadratic_form_engine",
            "settings_from_dict",
            "spectrum_settings_from_dict",
        ],
        "tiny_llm.workers.settings",
    ),
    **dict.fromkeys(["analyze_spectrum"], "tiny_llm.workers.spectrum"),
    **dict.fromkeys(["analyze_state"], "tiny_llm.workers.state"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
