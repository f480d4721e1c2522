"""The cross-seed experiment: geometry metrics of one model on a reference set (metrics), the
reference set and per-checkpoint records (experiment), the comparison of seeds (comparison), and
its figures (figures).
"""

from tiny_llm.geometry.comparison import compare, write_comparison
from tiny_llm.geometry.experiment import (
    GeometrySettings,
    as_analysis_settings,
    geometry_settings_from_dict,
    make_reference,
    measure_checkpoint,
    measurement_seconds,
    measurement_work,
)
from tiny_llm.geometry.figures import CONTROL_LABELS, PAIR_METRICS, RUN_METRICS, compare_experiments, dashboard
from tiny_llm.geometry.metrics import (
    batch_gradients,
    concentration,
    cosine_matrix,
    cross_batch_cosine,
    fisher_trace,
    function_gradients,
    hessian_trace,
    jacobian_frobenius,
    local_learning_coefficient,
    random_overlap,
    reference_gradient,
    subspace_overlap,
    top_subspace,
)

__all__ = [
    "CONTROL_LABELS",
    "GeometrySettings",
    "PAIR_METRICS",
    "RUN_METRICS",
    "as_analysis_settings",
    "batch_gradients",
    "compare",
    "compare_experiments",
    "concentration",
    "cosine_matrix",
    "cross_batch_cosine",
    "dashboard",
    "fisher_trace",
    "function_gradients",
    "geometry_settings_from_dict",
    "hessian_trace",
    "jacobian_frobenius",
    "local_learning_coefficient",
    "make_reference",
    "measure_checkpoint",
    "measurement_seconds",
    "measurement_work",
    "random_overlap",
    "reference_gradient",
    "subspace_overlap",
    "top_subspace",
    "write_comparison",
]
