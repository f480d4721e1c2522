"""What one job runs: the (state, case) analysis (state), the spectrum of a state (spectrum), and
the index of a run's checkpoints into unique parameter states (index). Each writes one result
file atomically, bound to its settings identity.

Names are imported on first use, so that the torch-free settings (``workers.settings``) can be
imported alone, by the command line among others.
"""

from tiny_llm.lazy import exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.workers.binding": ["check_output_binding", "output_binding"],
        "tiny_llm.workers.settings": [
            "AnalysisSettings",
            "CASES",
            "SpectrumSettings",
            "quadratic_form_engine",
            "settings_from_dict",
            "spectrum_settings_from_dict",
        ],
        "tiny_llm.workers.spectrum": ["analyze_spectrum"],
        "tiny_llm.workers.state": ["analyze_state"],
        "tiny_llm.workers.index": ["index_states"],
        "tiny_llm.workers.loading": ["LoadedState", "load_state"],
        "tiny_llm.workers.selection": ["check_selection", "resolve_checkpoints", "select_checkpoints"],
        "tiny_llm.workers.resolution": ["Resolution", "memory_plan", "resolve"],
    },
)
