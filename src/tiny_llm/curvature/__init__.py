"""The maths: the full-epoch token-weighted Hessian operator (hessian), one loop for every
placement of a job's model (placement: one process, data-parallel or FSDP-sharded ranks) and its
engines (engines: the registry; forms and products: their batch computations), what a (state, case)
job computes (measurement, torch-free), one job's passes (job), the gradients (gradients), the
held vectors and their seeded draws (vectors), the statistics declared once with their standard
errors (statistics), a (state, case) measurement (noise) with its precision audit (audit),
Lanczos, SLQ, CG and block-diagonal errors on the same operator (spectrum), and the memory model
that cuts every pass to fit a budget (memory).

Names are imported on first use, so that the torch-free modules (the engine registry) can be
imported alone.
"""

from tiny_llm.lazy import ALL, exports

__all__, __getattr__ = exports(
    __name__,
    {
        "tiny_llm.curvature.audit": ["precision_audit"],
        "tiny_llm.curvature.engines": ["ENGINES", "Engine", "engine", "names", "register"],
        "tiny_llm.curvature.gradients": [
            "batch_gradient",
            "batch_gradient_and_loss",
            "mean_gradient",
            "mean_gradient_and_loss",
            "noise_batch_indices",
        ],
        "tiny_llm.curvature.hessian": ["EpochHessian", "FlatParameters", "Precision", "pad_sequences"],
        "tiny_llm.curvature.measurement": ["MeasurementPlan"],
        "tiny_llm.curvature.memory": ["MemoryPlan", "pass_bytes", "plan_analysis"],
        "tiny_llm.curvature.placement": ["Placement", "place"],
        "tiny_llm.curvature.vectors": ["Layout", "Vectors", "rademacher"],
        "tiny_llm.curvature.job": ["Cuts", "Job", "open_job"],
        "tiny_llm.curvature.memory_measure": ["StoragePeak", "device_budget", "measure_pass"],
        "tiny_llm.curvature.case": ["CaseInputs"],
        "tiny_llm.curvature.noise": ["measure_case"],
        "tiny_llm.curvature.spectrum": ALL,
        "tiny_llm.curvature.statistics": [
            "STANDARD_ERRORS",
            "STATISTICS",
            "Samples",
            "Statistic",
            "standard_errors",
            "summarise",
        ],
    },
)
