"""The maths: the full-epoch token-weighted Hessian operator and its engines (hessian), the
gradient-noise statistics with their standard errors and precision audit (noise), and Lanczos,
SLQ, CG and block-diagonal errors on the same operator (spectrum), and the memory model that
cuts every pass to fit a budget (memory).

Names are imported on first use, so that the torch-free modules (the engine registry) can be
imported alone.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(
        ["ENGINES", "EpochHessian", "FORM_ENGINES", "FlatParameters", "HVP_ENGINES", "Precision", "pad_sequences"],
        "tiny_llm.curvature.hessian",
    ),
    **dict.fromkeys(
        ["MemoryPlan", "StoragePeak", "device_budget", "pass_bytes", "plan_analysis"], "tiny_llm.curvature.memory"
    ),
    **dict.fromkeys(
        [
            "CaseInputs",
            "STANDARD_ERRORS",
            "batch_gradient",
            "batch_gradient_and_loss",
            "mean_gradient",
            "mean_gradient_and_loss",
            "measure_case",
            "noise_batch_indices",
            "precision_audit",
            "rademacher",
            "standard_errors",
            "summarise",
        ],
        "tiny_llm.curvature.noise",
    ),
    **dict.fromkeys(
        [
            "LanczosResult",
            "block_diagonal_error",
            "conjugate_gradient",
            "lanczos",
            "layer_blocks",
            "slq",
            "slq_density",
            "tensor_blocks",
            "top_eigenpairs",
        ],
        "tiny_llm.curvature.spectrum",
    ),
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
