"""What one job runs: the (state, case) analysis (state), the spectrum of a state (spectrum), and
the index of a run's checkpoints into unique parameter states (index). Each writes one result
file atomically, bound to its settings identity.
"""

from tiny_llm.workers.index import check_selection, index_states, select_checkpoints
from tiny_llm.workers.spectrum import SpectrumSettings, analyze_spectrum, spectrum_settings_from_dict
from tiny_llm.workers.state import (
    CASES,
    AnalysisSettings,
    LoadedState,
    analyze_state,
    check_output_binding,
    load_state,
    output_binding,
    quadratic_form_engine,
    resolve_checkpoints,
    settings_from_dict,
)

__all__ = [
    "AnalysisSettings",
    "CASES",
    "LoadedState",
    "SpectrumSettings",
    "analyze_spectrum",
    "analyze_state",
    "check_output_binding",
    "check_selection",
    "index_states",
    "load_state",
    "output_binding",
    "quadratic_form_engine",
    "resolve_checkpoints",
    "select_checkpoints",
    "settings_from_dict",
    "spectrum_settings_from_dict",
]
