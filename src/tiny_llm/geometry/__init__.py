"""The cross-seed experiment: geometry metrics of one model on a reference set (metrics), the
reference set and per-checkpoint records (experiment), the comparison of seeds (comparison), and
its figures (figures), and the settings (settings: torch-free, for the planner).

Names are imported on first use, so that the planner's settings do not import the measurement.
"""

from tiny_llm.lazy import ALL, exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.geometry.comparison": ["compare", "write_comparison"],
        "tiny_llm.geometry.experiment": ["make_reference", "measure_checkpoint"],
        "tiny_llm.geometry.figures": [
            "CONTROL_LABELS",
            "PAIR_METRICS",
            "RUN_METRICS",
            "compare_experiments",
            "dashboard",
        ],
        "tiny_llm.geometry.settings": [
            "GeometrySettings",
            "as_analysis_settings",
            "geometry_settings_from_dict",
            "measurement_seconds",
            "measurement_work",
        ],
        "tiny_llm.geometry.metrics": ALL,
    },
)
