"""The curvature engines, declared once.

An engine computes, for one curvature micro-batch, either quadratic forms vᵀH_b v (kind
``forms``) or Hessian-vector products H_b v (kind ``products``) for K directions at once. Each is
an :class:`Engine` in :data:`ENGINES`: what it needs (second-order jet rules of every layer,
attention it can differentiate twice), what it supports (compilation, the placements it runs under), the
key of its fitted memory model, how a pass groups sequences by default, and its batch computation
(``"module:function"``, imported when an operator first uses it, so that this registry, and the
command line that reads its names, need no torch).

Everything that lists or tests engines derives from here: ``EpochHessian``'s dispatch, the
settings' ``engine`` choices, the command line's ``--engine`` choices, the workflow schema's enum
(a test holds it equal), the memory model's coefficients (a test finds one per engine) and the
tests' parametrisation. Adding an engine is its batch function (one module), one
:func:`register` call here and its memory fit (``benchmarks/memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tiny_llm.architectures import JET_REFUSAL  # why a jet engine refuses a model (declared there)
from tiny_llm.registry import load, named

__all__ = [
    "AMP_DIFFERENCES",
    "AUTO",
    "ENGINES",
    "Engine",
    "FINITE_DIFFERENCE",
    "GRADIENT",
    "JET_REFUSAL",
    "default_forms_engine",
    "benchmarked",
    "default_products_engine",
    "engine",
    "group_sizes",
    "names",
    "register",
    "sharded_names",
]

AUTO = "auto"
"""The setting that lets the analysis choose (see :func:`default_forms_engine`)."""
GRADIENT = "gradient"
"""The memory-model key of a plain gradient pass (mean and sampled batch gradients)."""
FINITE_DIFFERENCE = "finite_difference"
"""The engine of sharded spectra (first derivatives only: every rank differentiates its shard)."""
AMP_DIFFERENCES = (
    "under bf16 autocast (amp) finite differences of gradients measure the bf16 forward's rounding, "
    "not the curvature (at the default step an error about the size of the forms themselves)"
)
"""Why products by finite differences refuse bf16 autocast. The difference of two gradients 2ε
apart is of order ε‖Hv‖, the bf16 forward's rounding of each gradient of order 4e-3‖g‖: measured
on the demo shape (benchmarks/README.md), 1.2× the forms' RMS at the default step and 2 % at best
with a larger one, against 0.2–0.7 % for the exact engines under the same autocast."""


@dataclass(frozen=True)
class Engine:
    """One curvature engine and what it declares."""

    name: str
    kind: Literal["forms", "products"]
    """``forms``: quadratic forms vᵀHv only (with their Gauss–Newton part); ``products``: Hv."""
    summary: str
    """One line for the documentation and ``--help``."""
    batch: str
    """``module:function`` computing one micro-batch: ``f(context, V, inputs, targets)`` (``context`` a
    :class:`tiny_llm.curvature.context.MicroBatchContext`) returns
    (2, K) forms and Gauss–Newton parts (zeros without ``gauss_newton``) for ``forms`` engines,
    (K, D) products for ``products``."""
    jets: bool = False
    """Needs every layer's second-order (jet) rule: native architectures only."""
    second_derivatives: bool = True
    """Differentiates attention twice, so needs the reference (explicit softmax) attention."""
    compiled: bool = False
    """Runs under ``torch.compile`` when asked (CUDA)."""
    placements: tuple[str, ...] = ("whole", "data_parallel")
    """The placements it runs under (``tiny_llm.curvature.placement.PLACEMENTS``): its batch
    computation, unchanged, on one process, on data-parallel ranks and, with ``sharded``, on a
    model sharded over the ranks (FSDP2), the one-rank case included, where V holds a rank's shards
    and the operator's placement provides what differs. An operator refuses it by name under any
    other."""
    head_chunks: bool = False
    """Takes the output head and loss in token chunks when the memory plan asks (``head_tokens``),
    on this project's own architectures: a chunk's logits, not a group's, exist at once."""
    rows_per_direction: bool = False
    """A pass takes B/K sequences of a B-sequence micro-batch by default (it holds K directions'
    coefficients per layer at once); otherwise the whole micro-batch."""
    memory: str = ""
    """Key of its fitted memory model (``tiny_llm.curvature.memory.COEFFICIENTS``); the name if empty."""
    gauss_newton: bool = False
    """Its forms come with their generalised Gauss–Newton part vᵀGv (the second row of its batch
    computation); without it the Gauss–Newton statistics are blank, never 0."""
    benchmarks: tuple[str, ...] = ("memory",)
    """The benchmark groups that measure it: ``memory`` (benchmarks/memory.py fits its memory model),
    ``hvp_cost`` (benchmarks/hvp_cost.py times it against a gradient)."""

    def __post_init__(self) -> None:
        if not self.memory:
            object.__setattr__(self, "memory", self.name)
        if self.gauss_newton and self.kind != "forms":
            raise ValueError(f"engine {self.name}: only a forms engine computes a Gauss–Newton part")

    @property
    def forms(self) -> bool:
        """Whether it computes quadratic forms directly (no Hv)."""
        return self.kind == "forms"

    @property
    def products(self) -> bool:
        """Whether it computes Hessian-vector products (spectra need one)."""
        return self.kind == "products"

    def compute(self) -> Callable[..., Any]:
        """Its batch computation (imported on first use)."""
        return load(self.batch)

    @property
    def sharded(self) -> bool:
        """Whether it runs on a model sharded over the ranks."""
        return "sharded" in self.placements

    def check_placement(self, placement: str) -> None:
        """Refuse a placement it does not declare.

        Raises:
            ValueError: naming the engines that run under it.
        """
        if placement not in self.placements:
            able = ", ".join(e.name for e in ENGINES.values() if placement in e.placements)
            where = "on a sharded model" if placement == "sharded" else f"under the {placement} placement"
            raise ValueError(f"engine {self.name} does not run {where}; the engines that do: {able}")

    def group_rows(self, K: int, B: int) -> int:
        """Sequences of a B-sequence micro-batch in one pass with K directions, by default."""
        return max(1, B // K) if self.rows_per_direction else B


def group_sizes(batch: int, largest: int | None = None, equal: bool = False) -> list[int]:
    """The group sizes a pass may cut a micro-batch of ``batch`` sequences into, largest first: at
    most ``largest`` (an engine's default group, or a memory plan's cap), and with ``equal`` only
    divisors of ``batch`` (equal groups: one compiled graph). The one grouping rule: the memory
    plan chooses among these, the operator cuts by the first under its cap.

    Example:
        >>> group_sizes(12, 5), group_sizes(12, 5, equal=True)
        ([5, 4, 3, 2, 1], [4, 3, 2, 1])
    """
    return [r for r in range(min(batch, largest or batch), 0, -1) if not equal or batch % r == 0]


ENGINES: dict[str, Engine] = {}
"""Every engine by name, in the order they are documented."""


def register(declared: Engine) -> Engine:
    """Add an engine to :data:`ENGINES` (a name is registered once)."""
    if declared.name in ENGINES or declared.name in (AUTO, GRADIENT):
        raise ValueError(f"engine {declared.name!r} is already registered or reserved")
    ENGINES[declared.name] = declared
    return declared


def engine(name: str) -> Engine:
    """The engine called ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    return named(ENGINES, name, "engine")


def names(kind: str | None = None) -> tuple[str, ...]:
    """Engine names, of one kind (``forms`` or ``products``) or all."""
    return tuple(name for name, e in ENGINES.items() if kind is None or e.kind == kind)


def benchmarked(group: str) -> tuple[str, ...]:
    """Names of the engines a benchmark group measures (``Engine.benchmarks``), in registry order.

    Example:
        >>> benchmarked("hvp_cost")
        ('taylor', 'adjoint', 'double_backward', 'pearlmutter')
    """
    return tuple(e.name for e in ENGINES.values() if group in e.benchmarks)


def sharded_names(kind: str | None = None, jets: bool = True) -> tuple[str, ...]:
    """Names of the engines that run on a sharded model (of one kind, or all), in registry order;
    ``jets=False``: only those that need no second-order rules."""
    return tuple(e.name for e in ENGINES.values() if e.sharded and kind in (None, e.kind) and (jets or not e.jets))


def default_forms_engine(K: int, jets: bool, sharded: bool = False) -> str:
    """The engine of quadratic forms under ``engine: auto``: adjoint for K > 1 directions per pass,
    taylor for K = 1 (the fastest exact engines measured, benchmarks/README.md); without jet rules
    (the adapter's models) double_backward. Sharded: the first registered engine that runs sharded
    on this model, an exact forms engine before a products one (taylor; finite_difference without
    jet rules)."""
    if sharded:
        return (sharded_names("forms", jets) + sharded_names("products", jets))[0]
    if not jets:
        return "double_backward"
    return "adjoint" if K > 1 else "taylor"


def default_products_engine(engine_name: str, compiled_on_cuda: bool) -> str:
    """The engine of Hessian-vector products (spectra): the forms' engine when it computes products,
    else pearlmutter compiled on CUDA and double_backward elsewhere."""
    if engine(engine_name).products:
        return engine_name
    return "pearlmutter" if compiled_on_cuda else "double_backward"


register(
    Engine(
        "taylor",
        "forms",
        "forward Taylor mode: one no-grad pass carries each activation's jet (z, dz/dt, d²z/dt²)",
        "tiny_llm.curvature.forms:taylor",
        jets=True,
        placements=("whole", "data_parallel", "sharded"),
        head_chunks=True,
        rows_per_direction=True,
        gauss_newton=True,
        benchmarks=("memory", "hvp_cost"),
    )
)
register(
    Engine(
        "adjoint",
        "forms",
        "one forward and reverse pass give every layer's adjoint, shared by the K directions; a "
        "tangent pass adds each layer's second-order term",
        "tiny_llm.curvature.forms:adjoint",
        jets=True,
        head_chunks=True,
        gauss_newton=True,
        benchmarks=("memory", "hvp_cost"),
    )
)
register(
    Engine(
        "double_backward",
        "products",
        "eager reverse-over-reverse, K directions through one batched vector-Jacobian product",
        "tiny_llm.curvature.products:double_backward",
        head_chunks=True,
        benchmarks=("memory", "hvp_cost"),
    )
)
register(
    Engine(
        "pearlmutter",
        "products",
        "forward-over-reverse jvp(grad) with torch.func, vmapped over the K directions",
        "tiny_llm.curvature.products:pearlmutter",
        compiled=True,
        head_chunks=True,
        benchmarks=("memory", "hvp_cost"),
    )
)
register(
    Engine(
        FINITE_DIFFERENCE,
        "products",
        "central differences of gradients (first derivatives only: any attention, shard-local)",
        "tiny_llm.curvature.products:finite_difference",
        second_derivatives=False,
        placements=("whole", "data_parallel", "sharded"),
        head_chunks=True,
    )
)
