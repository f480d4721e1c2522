"""How much memory a curvature pass needs, and how to cut a micro-batch so that it fits a budget.

Every engine processes a curvature micro-batch in groups of sequences (``EpochHessian``'s
``group_rows``); the loss is a sum over sequences, so a group adds its share and the numbers do not
depend on the grouping. The memory of one pass is, to within the accuracy stated in
benchmarks/README.md,

    peak = resident + rows · per_sequence(engine, K)

* ``resident``: what the job holds whatever the grouping: the model's parameters, the operator's
  flat copy θ, the K directions of the pass and their float64 results, the job's float64 vectors
  (ḡ, a sampled gradient, a noise direction) and, for the HVP engines, the K products of a group.
* ``per_sequence``: what one sequence of a group adds, in elements of the analysis dtype per
  target position (times T and the dtype's size):

      L · (a_d·d + a_f·f + a_s·h·T) + (b_d·d + b_f·f + b_s·h·T) + c_v·V,   each coefficient α + β·K

  with L layers, width d, feed-forward width f, h heads, context T and vocabulary V. The first
  group of terms is what every layer keeps for a reverse pass (the HVP engines, the adjoint
  record pass, the gradient), the second what one layer holds at a time (the jets of taylor
  and adjoint mode, whose pass runs under ``no_grad``), the last the logits. The coefficients
  were fitted to storage counts of the passes (``benchmarks/memory.py``; :class:`StoragePeak`).

bf16 autocast is priced as float32: the attention core, the norms and the loss stay float32, and
the measured peak differs by a few per cent.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tiny_llm.config import ModelConfig
from tiny_llm.curvature.engines import GRADIENT
from tiny_llm.curvature.engines import engine as engine_named

__all__ = [
    "COEFFICIENTS",
    "FEATURES",
    "GRADIENT",
    "GiB",
    "MemoryPlan",
    "PHASES",
    "PassPlan",
    "StoragePeak",
    "choose_group_rows",
    "device_budget",
    "features",
    "measure_pass",
    "parameter_count",
    "pass_bytes",
    "plan_analysis",
    "plan_spectrum",
    "resident_bytes",
]

GiB = 2**30
MODEL_MARGIN = 1.1
"""A group fits when its predicted peak times this is within the budget: the model's largest error
over the checked shapes is about 10 % (benchmarks/README.md)."""

FEATURES = ("D", "Ld", "Lf", "LhT", "d", "f", "hT", "V")
"""What memory scales with: D parameters; per sequence and target position, L layers of width d,
feed-forward width f and h heads of T² scores, one layer's worth of each, and V logits."""
PHASES = (("D", "Ld", "Lf", "LhT", "d", "hT"), ("D", "Ld", "Lf", "LhT", "d", "f"), ("D", "Ld", "Lf", "LhT", "d", "V"))
"""The peak of a pass is in one of three phases: a layer's attention core, its feed-forward block,
or the logits and loss. Each phase's live memory is linear in the features it names."""
COEFFICIENTS: dict[str, tuple[dict[str, tuple[float, float]], ...]] = {}
"""Per engine and phase, feature -> (α, β): α + β·K elements per unit of the feature (fitted by
benchmarks/memory.py; see benchmarks/README.md)."""
COEFFICIENTS.update(
    {
        "taylor": (
            {
                "D": (1.024, 0.955),
                "Ld": (-0.288, 0.612),
                "Lf": (0.145, 0.186),
                "LhT": (0.167, -0.111),
                "d": (8.428, 11.806),
                "hT": (1.418, 7.331),
            },
            {
                "D": (0.857, 1.049),
                "Ld": (-1.322, 3.818),
                "Lf": (2.009, -1.446),
                "LhT": (-0.263, 0.008),
                "d": (14.08, -7.733),
                "f": (-0.588, 16.804),
            },
            {
                "D": (1.317, 1.164),
                "Ld": (-7.133, -9.985),
                "Lf": (0.088, 1.548),
                "LhT": (0.585, 1.92),
                "d": (-7.219, 31.655),
                "V": (4.594, 1.344),
            },
        ),
        "adjoint": (
            {
                "D": (1.122, 0.948),
                "Ld": (11.091, -0.723),
                "Lf": (20.082, -0.556),
                "LhT": (2.533, -0.235),
                "d": (-16.014, 16.837),
                "hT": (1.877, 2.194),
            },
            {
                "D": (1.242, 0.819),
                "Ld": (5.851, 4.663),
                "Lf": (24.842, -4.273),
                "LhT": (3.457, 0.657),
                "d": (46.749, -13.057),
                "f": (-25.379, 15.455),
            },
            {
                "D": (1.846, 1.156),
                "Ld": (-11.013, -5.205),
                "Lf": (16.049, -0.007),
                "LhT": (3.798, 0.491),
                "d": (7.401, 16.639),
                "V": (2.972, 2.085),
            },
        ),
        "double_backward": (
            {
                "D": (2.1, 3.399),
                "Ld": (8.915, 15.446),
                "Lf": (7.673, 2.684),
                "LhT": (1.123, 2.155),
                "d": (17.87, -6.896),
                "hT": (2.077, 5.622),
            },
            {
                "D": (1.943, 3.959),
                "Ld": (18.639, 9.724),
                "Lf": (4.141, 5.773),
                "LhT": (-0.414, 2.736),
                "d": (-6.139, 9.558),
                "f": (7.195, -1.665),
            },
            {
                "D": (0.635, 4.914),
                "Ld": (24.113, 5.931),
                "Lf": (6.509, 3.758),
                "LhT": (2.15, 1.814),
                "d": (2.112, 3.399),
                "V": (1.445, 4.378),
            },
        ),
        "pearlmutter": (
            {
                "D": (0.644, 4.814),
                "Ld": (-32.687, 30.083),
                "Lf": (10.576, 9.943),
                "LhT": (4.628, 2.76),
                "d": (41.048, -2.296),
                "hT": (0.396, 3.299),
            },
            {
                "D": (1.11, 4.444),
                "Ld": (20.062, 18.511),
                "Lf": (10.268, 11.116),
                "LhT": (3.757, 3.918),
                "d": (8.121, 20.509),
                "f": (2.974, -3.006),
            },
            {
                "D": (2.86, 5.034),
                "Ld": (28.239, 21.673),
                "Lf": (11.032, 9.529),
                "LhT": (1.741, 4.111),
                "d": (9.974, 4.918),
                "V": (1.537, 3.11),
            },
        ),
        "finite_difference": (
            {
                "D": (2.076, 3.874),
                "Ld": (13.945, 2.08),
                "Lf": (9.624, 0.164),
                "LhT": (3.201, -0.054),
                "d": (5.883, -0.535),
                "hT": (1.225, -0.003),
            },
            {
                "D": (2.879, 4.006),
                "Ld": (24.907, -0.324),
                "Lf": (13.043, -0.379),
                "LhT": (2.704, 0.074),
                "d": (10.743, 0.325),
                "f": (-2.86, 0.595),
            },
            {
                "D": (-1.256, 5.885),
                "Ld": (26.674, -2.953),
                "Lf": (10.14, -0.955),
                "LhT": (3.208, 0.093),
                "d": (19.448, -6.714),
                "V": (4.341, 0.166),
            },
        ),
        "gradient": (
            {
                "D": (1.698, -0.021),
                "Ld": (8.481, 0.907),
                "Lf": (1.023, -0.004),
                "LhT": (1.274, -0.026),
                "d": (-0.974, -1.025),
                "hT": (1.637, 0.033),
            },
            {
                "D": (2.383, -0.026),
                "Ld": (-19.289, -8.867),
                "Lf": (-3.372, 2.315),
                "LhT": (3.552, -0.638),
                "d": (-7.179, 12.531),
                "f": (9.785, -1.698),
            },
            {
                "D": (1.12, -0.003),
                "Ld": (9.459, 0.145),
                "Lf": (5.103, 0.013),
                "LhT": (1.099, -0.002),
                "d": (6.726, -0.456),
                "V": (2.622, 0.033),
            },
        ),
    }
)


class StoragePeak(TorchDispatchMode):
    """Count the bytes of live tensor storage created inside the block, and their peak.

    Every storage that an operator returns is counted once (views share it) until it is freed.
    Storages that existed before the block (the model, the inputs) are not counted.

    Example:
        >>> with StoragePeak() as counter:
        ...     x = torch.ones(1000, dtype=torch.float64); y = x * 2; del x
        >>> counter.peak, counter.live
        (16000, 8000)
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._seen or tensor.device.type == "meta":
            return
        nbytes = storage.nbytes()
        self._seen[key] = weakref.ref(storage, lambda _, key=key, nbytes=nbytes: self._release(key, nbytes))
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self._count(value)
        return out


class _CudaPeak:
    """``torch.cuda.max_memory_allocated`` above what was allocated when the block began."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, 0

    def __enter__(self) -> _CudaPeak:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.base


def measure_pass(
    config: ModelConfig,
    engine: str,
    rows: int,
    K: int,
    seq_len: int,
    dtype: torch.dtype = torch.float32,
    amp: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    compile: bool = False,
) -> int:
    """Peak bytes that one pass of ``engine`` (or ``GRADIENT``) over one group of ``rows``
    sequences with K directions allocates: live storage on CPU (:class:`StoragePeak`), the
    allocator's peak on CUDA. The parameters and the directions themselves are not included (they
    are part of :func:`resident_bytes`)."""
    from tiny_llm.curvature.hessian import EpochHessian, Precision
    from tiny_llm.model.architectures import build_model
    from tiny_llm.model.causal import token_losses

    device = torch.device(device)
    counter = _CudaPeak(device) if device.type == "cuda" else StoragePeak()
    torch.manual_seed(seed)
    model = build_model(config, attention_backend="reference").to(device, dtype)
    precision = Precision(device, dtype, amp)
    if engine == GRADIENT:
        tokens = torch.randint(0, config.vocab_size, (rows, seq_len + 1), device=device)
        with counter:
            loss = token_losses(precision.forward(model, tokens[:, :-1]), tokens[:, 1:]).sum() / tokens[:, 1:].numel()
            loss.backward()
            del loss
        return counter.peak
    spec = engine_named(engine)
    batch = rows * K if spec.rows_per_direction else rows  # taylor mode's groups are at most B/K sequences
    tokens = torch.randint(0, config.vocab_size, (batch, seq_len + 1), device=device)
    H = EpochHessian(
        model,
        tokens,
        batch_size=batch,
        engine=engine,
        precision=precision,
        directions_per_pass=K,
        group_rows=rows,
        compile=compile,
    )
    V = torch.randn(K, H.flat.D, dtype=dtype, device=device)
    products = spec.products
    if compile:  # compilation's own workspaces are not the pass's
        H.hvp(V)
    with counter:  # jet engines keep their workspace between groups: the second pass is the steady state
        for _ in range(1 if products else 2):
            (H.hvp if products else H.quadratic_forms)(V)
    return counter.peak


def size(nbytes: float) -> str:
    """Bytes as a short human-readable size (binary units)."""
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def parameter_count(config: ModelConfig) -> int:
    """D, the unique trainable parameters of a model of this shape (built on the meta device)."""
    from tiny_llm.model.architectures import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(config).parameters())


def features(config: ModelConfig, rows: int, seq_len: int, D: int | None = None) -> dict[str, float]:
    """The quantities of FEATURES for one group of ``rows`` sequences of ``seq_len`` targets."""
    L, d, f, h, V, T = config.n_layers, config.d_model, config.d_ff, config.n_heads, config.vocab_size, seq_len
    n = rows * T
    return {
        "D": D if D is not None else parameter_count(config),
        "Ld": n * L * d,
        "Lf": n * L * f,
        "LhT": n * L * h * T,
        "d": n * d,
        "f": n * f,
        "hT": n * h * T,
        "V": n * V,
    }


def pass_bytes(
    engine: str, config: ModelConfig, rows: int, K: int, seq_len: int, itemsize: int, D: int | None = None
) -> int:
    """Predicted peak bytes that one pass of ``engine`` (or GRADIENT) over ``rows`` sequences with K
    directions allocates on top of the job's resident tensors (what :func:`measure_pass` counts)."""
    key = engine if engine == GRADIENT else engine_named(engine).memory
    if key not in COEFFICIENTS:
        raise ValueError(f"no memory model for engine {engine!r}; known: {', '.join(COEFFICIENTS)}")
    x = features(config, rows, seq_len, D)
    phases = [sum((a + b * K) * x[name] for name, (a, b) in phase.items()) for phase in COEFFICIENTS[key]]
    return int(itemsize * max(phases))


def resident_bytes(D: int, K: int, itemsize: int, extra_vectors: int = 0) -> int:
    """What a job holds on the device whatever the grouping: the model and the operator's flat θ,
    the K queued and stacked directions, four float64 vectors (ḡ, a sampled gradient, a noise
    direction, a product accumulator) and ``extra_vectors`` more float64 vectors (audited directions,
    packed workers' consensus errors)."""
    return D * (itemsize * (2 + 2 * K) + 8 * (4 + extra_vectors))


@dataclass(frozen=True)
class PassPlan:
    """One kind of pass of a job: its engine, K, the group of sequences and the predicted peak."""

    name: str
    engine: str
    K: int
    batch: int
    """Sequences of the micro-batch the pass is over."""
    rows: int
    """Sequences per group (``batch`` when unchunked)."""
    peak_bytes: int
    """Resident plus the pass at that group, predicted."""

    def describe(self) -> str:
        chunk = "unchunked" if self.rows >= self.batch else f"{self.rows} of {self.batch} sequences per group"
        return f"{self.name} {chunk}, ~{size(self.peak_bytes)}"


@dataclass(frozen=True)
class MemoryPlan:
    """The grouping of every pass of a job under a memory budget (None: no budget, unchunked)."""

    budget_bytes: int | None
    passes: tuple[PassPlan, ...]

    @property
    def peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.passes)

    def rows(self, name: str) -> int | None:
        """Group rows of the pass ``name`` (None when unchunked, the engines' default)."""
        plan = next(p for p in self.passes if p.name == name)
        return None if plan.rows >= plan.batch else plan.rows

    def record(self) -> dict[str, Any]:
        """Plain data for a result's execution record."""
        return {
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.peak_bytes,
            "passes": [
                {
                    "name": p.name,
                    "engine": p.engine,
                    "directions": p.K,
                    "batch": p.batch,
                    "group_rows": p.rows,
                    "predicted_peak_bytes": p.peak_bytes,
                }
                for p in self.passes
            ],
        }

    def describe(self) -> str:
        budget = "no budget" if self.budget_bytes is None else f"budget {size(self.budget_bytes)}"
        return (
            f"memory: predicted peak ~{size(self.peak_bytes)} ({budget}; "
            + "; ".join(p.describe() for p in self.passes)
            + ")"
        )


def choose_group_rows(
    name: str,
    engine: str,
    config: ModelConfig,
    batch: int,
    K: int,
    seq_len: int,
    itemsize: int,
    budget_bytes: int | None,
    resident: int,
    equal_groups: bool = False,
    D: int | None = None,
    largest: int | None = None,
    setting: str = "memory_budget_gb",
) -> PassPlan:
    """The largest group of sequences (at most ``largest``, by default ``batch``; a divisor of
    ``batch`` with ``equal_groups``) whose predicted peak, ``resident`` plus the pass, fits
    ``budget_bytes`` with the model's margin (MODEL_MARGIN).

    Raises:
        ValueError: when one sequence per group does not fit, naming the settings to change.
    """

    def peak(rows: int) -> int:
        return resident + pass_bytes(engine, config, rows, K, seq_len, itemsize, D)

    candidates = [r for r in range(min(batch, largest or batch), 0, -1) if not equal_groups or batch % r == 0]
    if budget_bytes is None:
        return PassPlan(name, engine, K, batch, candidates[0], peak(candidates[0]))
    for rows in candidates:
        if peak(rows) * MODEL_MARGIN <= budget_bytes:
            return PassPlan(name, engine, K, batch, rows, peak(rows))
    what = "" if engine == GRADIENT else f" with {K} direction{'s' if K > 1 else ''} ({engine} engine)"
    lower = "data.seq_len" if engine == GRADIENT else "directions_per_pass or data.seq_len"
    raise ValueError(
        f"{name}: one sequence of {seq_len} tokens{what} needs ~{size(peak(1) * MODEL_MARGIN)} "
        f"(with the model's margin), more than {setting} = "
        f"{size(budget_bytes)}; lower {lower}, or raise the budget"
    )


def plan_analysis(
    config: ModelConfig,
    seq_len: int,
    *,
    engine: str,
    K: int,
    hvp_batch_size: int,
    micro_batch_size: int,
    itemsize: int,
    compiled: bool,
    audit_directions: int | None,
    extra_vectors: int,
    budget_bytes: int | None,
) -> MemoryPlan:
    """The grouping of a (state, case) job's passes: the gradient passes (training's micro-batches),
    the quadratic forms (K directions on curvature micro-batches) and, when audited, the float64
    audit (2a + 1 directions, adjoint engine, beside the production model).

    Raises:
        ValueError: a pass that does not fit ``budget_bytes`` even one sequence at a time.
    """
    D = parameter_count(config)
    audited = 0 if audit_directions is None else 2 * audit_directions + 1
    resident = resident_bytes(D, K, itemsize, extra_vectors + audited)
    passes = [
        choose_group_rows(
            "gradient", GRADIENT, config, micro_batch_size, 1, seq_len, itemsize, budget_bytes, resident, D=D
        ),
        choose_group_rows(
            "forms",
            engine,
            config,
            hvp_batch_size,
            K,
            seq_len,
            itemsize,
            budget_bytes,
            resident,
            equal_groups=compiled,
            D=D,
            largest=max(1, hvp_batch_size // K) if engine_named(engine).rows_per_direction else None,
        ),
    ]
    if audit_directions is not None:  # the production model and θ stay; a float64 copy, its θ and ḡ join them
        beside = resident + 16 * D + audited * D * 16
        passes.append(
            choose_group_rows(
                "audit_gradient", GRADIENT, config, micro_batch_size, 1, seq_len, 8, budget_bytes, beside, D=D
            )
        )
        passes.append(
            choose_group_rows(
                "audit", "adjoint", config, hvp_batch_size, audited, seq_len, 8, budget_bytes, beside, D=D
            )
        )
    return MemoryPlan(budget_bytes, tuple(passes))


def plan_spectrum(
    config: ModelConfig,
    seq_len: int,
    *,
    engine: str,
    K: int,
    hvp_batch_size: int,
    micro_batch_size: int,
    itemsize: int,
    compiled: bool,
    basis_bytes: int,
    extra_vectors: int,
    budget_bytes: int | None,
    shards: int = 1,
) -> MemoryPlan:
    """The grouping of a spectrum job's passes: gradients, and Hessian-vector products of at most K
    directions (one for Lanczos, SLQ and CG), beside the Lanczos basis (``basis_bytes``, this
    rank's) and ``extra_vectors`` float64 vectors (the sampled noise directions). Sharded over
    ``shards`` ranks, every parameter-sized term is a rank's 1/shards (FSDP gathers one block's
    parameters at a time, small beside the activations).

    Raises:
        ValueError: a pass that does not fit ``budget_bytes`` even one sequence at a time.
    """
    D = -(-parameter_count(config) // shards)
    resident = resident_bytes(D, K, itemsize, extra_vectors) + basis_bytes
    return MemoryPlan(
        budget_bytes,
        (
            choose_group_rows(
                "gradient", GRADIENT, config, micro_batch_size, 1, seq_len, itemsize, budget_bytes, resident, D=D
            ),
            choose_group_rows(
                "products",
                engine,
                config,
                hvp_batch_size,
                K,
                seq_len,
                itemsize,
                budget_bytes,
                resident,
                equal_groups=compiled,
                D=D,
            ),
        ),
    )


def device_budget(device: torch.device, setting_gb: float | None, margin: float = 0.1) -> int | None:
    """The memory budget of a job in bytes: ``setting_gb`` when given; on CUDA by default the
    device's free memory less a margin (10 %, at least 2 GiB, for the allocator's fragmentation
    and the compiled kernels' workspaces); elsewhere None (no budget)."""
    if setting_gb is not None:
        return int(setting_gb * GiB)
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free - max(margin * total, 2 * GiB))
