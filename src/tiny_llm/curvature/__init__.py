"""The maths: the full-epoch token-weighted Hessian operator (hessian) and its engines (engines:
the registry; forms and products: their batch computations), the gradients and seeded draws
(gradients), the statistics declared once with their standard errors (statistics), a (state, case)
measurement (noise) with its precision audit (audit), Lanczos, SLQ, CG and block-diagonal errors
on the same operator (spectrum), and the memory model that cuts every pass to fit a budget
(memory).

Names are imported on first use, so that the torch-free modules (the engine registry) can be
imported alone.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(["precision_audit"], "tiny_llm.curvature.audit"),
    **dict.fromkeys(["ENGINES", "Engine", "engine", "names", "register"], "tiny_llm.curvature.engines"),
    **dict.fromkeys(
        [
            "batch_gradient",
            "batch_gradient_and_loss",
            "mean_gradient",
            "mean_gradient_and_loss",
            "noise_batch_indices",
            "rademacher",
        ],
        "tiny_llm.curvature.gradients",
    ),
    **dict.fromkeys(["EpochHessian", "FlatParameters", "Precision", "pad_sequences"], "tiny_llm.curvature.hessian"),
    **dict.fromkeys(["MemoryPlan", "pass_bytes", "plan_analysis"], "tiny_llm.curvature.memory"),
    **dict.fromkeys(["StoragePeak", "device_budget", "measure_pass"], "tiny_llm.curvature.memory_measure"),
    **dict.fromkeys(["CaseInputs"], "tiny_llm.curvature.case"),
    **dict.fromkeys(["measure_case"], "tiny_llm.curvature.noise"),
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
    **dict.fromkeys(
        ["STANDARD_ERRORS", "STATISTICS", "Samples", "Statistic", "standard_errors", "summarise"],
        "tiny_llm.curvature.statistics",
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
