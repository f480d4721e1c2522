"""How much memory a curvature pass needs, and how to cut a micro-batch so that it fits a budget.

Every engine processes a curvature micro-batch in groups of sequences (``EpochHessian``'s
``group_rows``); the loss is a sum over sequences, so a group adds its share and the numbers do not
depend on the grouping. The memory of one pass is, to within the accuracy stated in
benchmarks/README.md,

    peak = resident + rows · per_sequence(engine, K)

* ``resident``: what the job holds whatever the grouping: the model's parameters, the operator's
  flat copy θ, the K directions of the pass and their float64 results, the job's float64 vectors
  (ḡ, a sampled gradient, a noise direction) and, for the HVP engines, the K products of a group.
  A gradient pass holds the directions queued for the next forms pass, never the K stacked for one
  (the queue is flushed the moment it holds K): its resident is K directions smaller.
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

import dataclasses
from dataclasses import dataclass
from typing import Any

from tiny_llm.architectures import jet_rules, parameter_shapes
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.engines import GRADIENT, default_forms_engine, group_sizes
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.memory_fit import COEFFICIENTS
from tiny_llm.curvature.sharding import forms_shape, head_chunked, held_unsharded

__all__ = [
    "COEFFICIENTS",
    "FEATURES",
    "GRADIENT",
    "GiB",
    "JobShape",
    "MemoryPlan",
    "PHASES",
    "PassPlan",
    "choose_group_rows",
    "features",
    "PassShape",
    "parameter_count",
    "pass_bytes",
    "plan_analysis",
    "plan_spectrum",
    "resident_bytes",
]

GiB = 2**30
MODEL_MARGIN = 1.1
"""A group fits when its predicted peak times this is within the budget. Predicted ÷ counted is
0.81-1.31 over every shape measured, from the smallest to Llama-3.2-1B's width and vocabulary
(benchmarks/README.md); the worst under-predictions (0.81-0.85, small widths at 50k-150k
vocabularies) are then at most a few per cent over the budget, which itself leaves the device a
tenth of its memory."""


FEATURES = ("D", "Ld", "Lf", "LhT", "d", "f", "hT", "V", "Vd", "Vdt", "Vdw", "Vdc")
"""What memory scales with: D parameters; per sequence and target position, L layers of width d,
feed-forward width f and h heads of T² scores, one layer's worth of each, and V logits; and the
head's V × d weight: once, again when the head is tied to the embedding (the gradients of the
shared weight exist before they are added), once more when a tied head is taken whole, and once
more when the head is taken in chunks (the head's gradient accumulated chunk by chunk)."""
PHASES = (
    ("D", "Ld", "Lf", "LhT", "d", "hT"),
    ("D", "Ld", "Lf", "LhT", "d", "f"),
    ("D", "Ld", "Lf", "LhT", "d", "V", "Vd", "Vdt", "Vdw", "Vdc"),
    ("D", "Vd", "Vdt", "Vdw", "Vdc"),
)
"""The peak of a pass is in one of four phases: a layer's attention core, its feed-forward block,
the logits and loss, or the end of a reverse pass (the parameters' gradients, the tied head's two).
Each phase's live memory is linear in the features it names."""


def size(nbytes: float) -> str:
    """Bytes as a short human-readable size (binary units)."""
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def parameter_count(config: ModelConfig) -> int:
    """D, the unique trainable parameters of a model of this shape."""
    return parameter_shapes(config).count


def features(
    config: ModelConfig, rows: int, seq_len: int, D: int | None = None, head_tokens: int | None = None
) -> dict[str, float]:
    """The quantities of FEATURES for one group of ``rows`` sequences of ``seq_len`` targets (the
    logits of at most ``head_tokens`` of them at a time)."""
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
        "V": min(n, head_tokens or n) * V,
        "Vd": V * d,
        "Vdt": V * d if config.tie_embeddings else 0,
        "Vdw": V * d if config.tie_embeddings and (head_tokens or n) >= n else 0,
        "Vdc": V * d if (head_tokens or n) < n else 0,
    }


@dataclass(frozen=True, kw_only=True)
class PassShape:
    """One pass to price (:func:`pass_bytes`), group (:func:`choose_group_rows`) or count
    (:func:`tiny_llm.curvature.memory_measure.measure_pass`): ``engine`` (or GRADIENT) over ``rows``
    sequences of ``seq_len`` targets of a model of shape ``config`` with K directions, numbers of
    ``itemsize`` bytes, parameter-sized vectors of D entries (default: the model's) and the head
    and loss ``head_tokens`` target positions at a time (None: all at once)."""

    engine: str
    config: ModelConfig
    rows: int
    K: int
    seq_len: int
    itemsize: int = 4
    D: int | None = None
    head_tokens: int | None = None


def pass_bytes(shape: PassShape) -> int:
    """Predicted peak bytes that one pass allocates on top of the job's resident tensors (what
    :func:`tiny_llm.curvature.memory_measure.measure_pass` counts)."""
    key = shape.engine if shape.engine == GRADIENT else engine_named(shape.engine).memory
    if key not in COEFFICIENTS:
        raise ValueError(f"no memory model for engine {shape.engine!r}; known: {', '.join(COEFFICIENTS)}")
    x = features(shape.config, shape.rows, shape.seq_len, shape.D, shape.head_tokens)
    phases = [sum((a + b * shape.K) * x[name] for name, (a, b) in phase.items()) for phase in COEFFICIENTS[key]]
    return int(shape.itemsize * max(phases))


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
    head_tokens: int | None = None
    """Target positions the head and loss take at a time (None: a group's at once)."""

    def describe(self) -> str:
        chunk = "unchunked" if self.rows >= self.batch else f"{self.rows} of {self.batch} sequences per group"
        head = "" if self.head_tokens is None else f", head {self.head_tokens} tokens at a time"
        return f"{self.name} {chunk}{head}, ~{size(self.peak_bytes)}"


@dataclass(frozen=True)
class MemoryPlan:
    """The grouping of every pass of a job under a memory budget (None: no budget, unchunked)."""

    budget_bytes: int | None
    passes: tuple[PassPlan, ...]
    shards: int = 1
    """Ranks the model is sharded over: the plan is one rank's."""

    @property
    def peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.passes)

    def rows(self, name: str) -> int | None:
        """Group rows of the pass ``name`` (None when unchunked, the engines' default)."""
        plan = next(p for p in self.passes if p.name == name)
        return None if plan.rows >= plan.batch else plan.rows

    def head_tokens(self, name: str) -> int | None:
        """Target positions the head and loss of pass ``name`` take at a time (None: all at once)."""
        return next(p for p in self.passes if p.name == name).head_tokens

    def cuts(self, name: str) -> dict[str, int | None]:
        """How the operator of pass ``name`` cuts its work: ``EpochHessian``'s ``group_rows`` and
        ``head_tokens``."""
        return {"group_rows": self.rows(name), "head_tokens": self.head_tokens(name)}

    def record(self) -> dict[str, Any]:
        """Plain data for a result's execution record."""
        return {
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.peak_bytes,
            **({"shards": self.shards} if self.shards > 1 else {}),
            "passes": [
                {
                    "name": p.name,
                    "engine": p.engine,
                    "directions": p.K,
                    "batch": p.batch,
                    "group_rows": p.rows,
                    **({} if p.head_tokens is None else {"head_tokens": p.head_tokens}),
                    "predicted_peak_bytes": p.peak_bytes,
                }
                for p in self.passes
            ],
        }

    def describe(self) -> str:
        budget = "no budget" if self.budget_bytes is None else f"budget {size(self.budget_bytes)}"
        where = f" per rank, sharded over {self.shards}" if self.shards > 1 else ""
        return (
            f"memory: predicted peak{where} ~{size(self.peak_bytes)} ({budget}; "
            + "; ".join(p.describe() for p in self.passes)
            + ")"
        )


def choose_group_rows(
    name: str,
    shape: PassShape,
    budget_bytes: int | None,
    resident: int,
    *,
    largest: int | None = None,
    equal_groups: bool = False,
    chunk_head: bool = False,
) -> PassPlan:
    """The largest group of the pass's ``shape.rows`` sequences (at most ``largest``; a divisor of
    them with ``equal_groups``: :func:`tiny_llm.curvature.engines.group_sizes`) whose predicted
    peak, ``resident`` plus the pass, fits ``budget_bytes`` with the model's margin (MODEL_MARGIN).
    With ``chunk_head`` (a pass whose head and loss can run in token chunks), a group whose head
    does not fit at once takes the head in the largest chunk that fits (halving from the whole
    group down to 64 positions) before the group is cut smaller: at a real vocabulary the logits,
    not the layers, bound the group.

    Raises:
        ValueError: when one sequence per group does not fit, naming the settings to change.
    """
    engine, K, batch, seq_len = shape.engine, shape.K, shape.rows, shape.seq_len

    def peak(rows: int, head_tokens: int | None = None) -> int:
        return resident + pass_bytes(dataclasses.replace(shape, rows=rows, head_tokens=head_tokens))

    candidates = group_sizes(batch, largest, equal_groups)
    if budget_bytes is None:
        return PassPlan(name, engine, K, batch, candidates[0], peak(candidates[0]))
    for rows in candidates:
        for head_tokens in _head_chunks(rows * seq_len, chunk_head):
            if peak(rows, head_tokens) * MODEL_MARGIN <= budget_bytes:
                return PassPlan(name, engine, K, batch, rows, peak(rows, head_tokens), head_tokens)
    what = "" if engine == GRADIENT else f" with {K} direction{'s' if K > 1 else ''} ({engine} engine)"
    lower = "data.seq_len" if engine == GRADIENT else "directions_per_pass or data.seq_len"
    raise ValueError(
        f"{name}: one sequence of {seq_len} tokens{what} needs ~{size(peak(1) * MODEL_MARGIN)} "
        f"(with the model's margin), more than memory_budget_gb = "
        f"{size(budget_bytes)}; lower {lower}, or raise the budget"
    )


HEAD_CHUNK_FLOOR = 64
"""The smallest head chunk the plan tries (target positions): below it the per-chunk matmuls are
too thin to be efficient, and the layers' activations of one sequence dominate anyway."""


def _head_chunks(tokens: int, chunk_head: bool) -> list[int | None]:
    """Head chunks to try for a group of ``tokens`` target positions, largest first: all at once,
    then halves down to HEAD_CHUNK_FLOOR."""
    chunks: list[int | None] = [None]
    half = tokens // 2
    while chunk_head and half >= HEAD_CHUNK_FLOOR:
        chunks.append(half)
        half //= 2
    return chunks


@dataclass(frozen=True, kw_only=True)
class JobShape:
    """What a job's passes are, for its memory plan: the model and context, the engine with its K
    directions per pass, the micro-batches, the bytes of a number, compilation and the ranks the
    model is sharded over."""

    config: ModelConfig
    seq_len: int
    engine: str
    K: int
    hvp_batch_size: int
    micro_batch_size: int
    itemsize: int
    compiled: bool = False
    shards: int = 1

    @property
    def held(self) -> int:
        """Entries of a parameter-sized vector a rank holds (rank 0's, the most) in the job's layout."""
        return parameter_shapes(self.config).rows(0, self.shards, self.shards > 1).held


def plan_analysis(
    job: JobShape, *, audit_directions: int | None, extra_vectors: int, budget_bytes: int | None, geometries: int = 1
) -> MemoryPlan:
    """The grouping of a (state, case) job's passes: the gradient passes (training's micro-batches),
    the quadratic forms (K directions on curvature micro-batches) and, when audited, the float64
    audit (2a + 1 directions in each of the job's ``geometries``, plain and the optimizer's, by the
    engine ``auto`` gives the model under the job's placement, on the shape that engine's pass holds,
    beside the production model).

    Sharded over ``shards`` ranks (FSDP2, ``tiny_llm.curvature.sharded``) the plan is one rank's:
    every parameter-sized term is its 1/shards, and a pass adds what FSDP unshards while it runs:
    the root's parameters (embedding, final norm, head) and the largest block's, with their
    gradients (gradient passes); the forms add the K directions of the largest block (the
    embeddings' and the head's are never gathered whole) and the gather's buffers.

    Raises:
        ValueError: a pass that does not fit ``budget_bytes`` even one sequence at a time.
    """
    config, seq_len, engine, K, itemsize, shards = job.config, job.seq_len, job.engine, job.K, job.itemsize, job.shards
    hvp_batch_size, micro_batch_size = job.hvp_batch_size, job.micro_batch_size
    D = job.held
    unsharded = held_unsharded(config, engine, K, shards, itemsize)  # what the sharded operator says

    def chunked(engine_: str) -> bool:  # the head in token chunks where the placement takes it so
        return head_chunked(config, engine_, shards)

    audited = 0 if audit_directions is None else geometries * (2 * audit_directions + 1)
    resident = resident_bytes(D, K, itemsize, extra_vectors + audited)
    stacked = K * itemsize * D  # the K directions stacked for a forms pass: a gradient pass has only the queue

    def fit(name: str, engine_: str, batch: int, k: int, size: int, beside: int, **options: Any) -> PassPlan:
        shape = PassShape(
            engine=engine_, config=options.pop("shape", config), rows=batch, K=k, seq_len=seq_len, itemsize=size, D=D
        )
        return choose_group_rows(name, shape, budget_bytes, beside, chunk_head=chunked(engine_), **options)

    largest = engine_named(engine).group_rows(K, hvp_batch_size)
    forms = {"shape": forms_shape(config, engine, shards), "equal_groups": job.compiled, "largest": largest}
    passes = [
        fit("gradient", GRADIENT, micro_batch_size, 1, itemsize, resident - stacked + unsharded[GRADIENT]),
        fit("forms", engine, hvp_batch_size, K, itemsize, resident + unsharded[engine], **forms),
    ]
    if audit_directions is not None:  # the production model and θ stay; a float64 copy, its θ and ḡ join them
        beside = resident + 16 * D + audited * D * 16
        audit_engine = default_forms_engine(audited, jet_rules(config), shards > 1)  # as the audit resolves it
        gathered = held_unsharded(config, audit_engine, audited, shards, 8)
        passes.append(fit("audit_gradient", GRADIENT, micro_batch_size, 1, 8, beside + gathered[GRADIENT]))
        audit_shape = forms_shape(config, audit_engine, shards)
        passes.append(fit("audit", audit_engine, hvp_batch_size, audited, 8, beside + gathered[audit_engine],
                          shape=audit_shape))  # fmt: skip
    return MemoryPlan(budget_bytes, tuple(passes), shards)


def plan_spectrum(job: JobShape, *, basis_bytes: int, extra_vectors: int, budget_bytes: int | None) -> MemoryPlan:
    """The grouping of a spectrum job's passes: gradients, and Hessian-vector products of at most K
    directions (one for Lanczos, SLQ and CG), beside the Lanczos basis (``basis_bytes``, this
    rank's) and ``extra_vectors`` float64 vectors (the sampled noise directions). Sharded over
    ``shards`` ranks, every parameter-sized term is a rank's 1/shards (FSDP gathers one block's
    parameters at a time, small beside the activations).

    Raises:
        ValueError: a pass that does not fit ``budget_bytes`` even one sequence at a time.
    """
    config, seq_len, itemsize = job.config, job.seq_len, job.itemsize
    D = job.held
    resident = resident_bytes(D, job.K, itemsize, extra_vectors) + basis_bytes
    stacked = job.K * itemsize * D  # the K directions stacked for a products pass: none in a gradient pass
    gradient = PassShape(
        engine=GRADIENT, config=config, rows=job.micro_batch_size, K=1, seq_len=seq_len, itemsize=itemsize, D=D
    )
    products = dataclasses.replace(gradient, engine=job.engine, rows=job.hvp_batch_size, K=job.K)
    return MemoryPlan(
        budget_bytes,
        (
            choose_group_rows("gradient", gradient, budget_bytes, resident - stacked),
            choose_group_rows("products", products, budget_bytes, resident, equal_groups=job.compiled),
        ),
    )
