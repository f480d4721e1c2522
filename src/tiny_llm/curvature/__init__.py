"""The maths: the full-epoch token-weighted Hessian operator and its engines (hessian), the
gradient-noise statistics with their standard errors and precision audit (noise), and Lanczos,
SLQ, CG and block-diagonal errors on the same operator (spectrum), and the memory model that
cuts every pass to fit a budget (memory).
"""

from tiny_llm.curvature.hessian import (
    ENGINES,
    FORM_ENGINES,
    HVP_ENGINES,
    EpochHessian,
    FlatParameters,
    Precision,
    pad_sequences,
)
from tiny_llm.curvature.memory import MemoryPlan, StoragePeak, device_budget, pass_bytes, plan_analysis
from tiny_llm.curvature.noise import (
    STANDARD_ERRORS,
    CaseInputs,
    batch_gradient,
    batch_gradient_and_loss,
    mean_gradient,
    mean_gradient_and_loss,
    measure_case,
    noise_batch_indices,
    precision_audit,
    rademacher,
    standard_errors,
    summarise,
)
from tiny_llm.curvature.spectrum import (
    LanczosResult,
    block_diagonal_error,
    conjugate_gradient,
    lanczos,
    layer_blocks,
    slq,
    slq_density,
    tensor_blocks,
    top_eigenpairs,
)

__all__ = [
    "CaseInputs",
    "ENGINES",
    "EpochHessian",
    "FORM_ENGINES",
    "FlatParameters",
    "HVP_ENGINES",
    "LanczosResult",
    "MemoryPlan",
    "Precision",
    "STANDARD_ERRORS",
    "StoragePeak",
    "batch_gradient",
    "batch_gradient_and_loss",
    "block_diagonal_error",
    "conjugate_gradient",
    "device_budget",
    "lanczos",
    "layer_blocks",
    "mean_gradient",
    "mean_gradient_and_loss",
    "measure_case",
    "noise_batch_indices",
    "pad_sequences",
    "pass_bytes",
    "plan_analysis",
    "precision_audit",
    "rademacher",
    "slq",
    "slq_density",
    "standard_errors",
    "summarise",
    "tensor_blocks",
    "top_eigenpairs",
]
