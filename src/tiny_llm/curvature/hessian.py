"""One curvature interface: the full-epoch, token-weighted loss Hessian H as an operator.

``EpochHessian(model, sequences, ...)`` represents H = ∇² L(θ) with
L(θ) = (1/N) Σ_t ℓ_t(θ), the token-mean cross-entropy over every target token t of an epoch
(N of them). It never materialises H: a pass over the epoch's curvature micro-batches serves K
directions at once, through one engine of :mod:`tiny_llm.curvature.engines`: quadratic forms vᵀHv
without Hessian-vector products (taylor, adjoint; :mod:`tiny_llm.curvature.forms`), or
Hessian-vector products Hv, which spectra need (double_backward, pearlmutter, finite_difference;
:mod:`tiny_llm.curvature.products`).

The last curvature micro-batch is padded with ignored targets, and a short final group of
directions is padded with zero directions when compiled, so one compiled graph serves every pass.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from tiny_llm.architectures import jet_rules
from tiny_llm.curvature.context import FlatParameters, MicroBatchContext
from tiny_llm.curvature.engines import AMP_DIFFERENCES, group_sizes, names
from tiny_llm.curvature.engines import ENGINES as REGISTRY
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.placement import Placement, place
from tiny_llm.model.causal import IGNORE_INDEX, check_jet_rules
from tiny_llm.model.llama import Llama
from tiny_llm.model.micro_batch import Precision

__all__ = ["CurvatureOperator", "EpochHessian", "FlatParameters", "Precision", "check_differences", "pad_sequences"]

log = logging.getLogger(__name__)


def check_differences(
    precision: Precision, model: torch.nn.Module | None = None, inputs: torch.Tensor | None = None
) -> None:
    """Refuse finite differences of gradients under bf16 autocast (``AMP_DIFFERENCES``), and in
    float64 on a model without second-order rules (an adapter's) that still computes some operation
    in a lower precision on ``inputs`` (one forward measures it): the difference of two gradients
    rounded there is about 1e-3 off, not a float64 derivative.

    Raises:
        ValueError: either, naming the operations and what to use instead.
    """
    if precision.amp:
        raise ValueError(f"finite differences: {AMP_DIFFERENCES}; analyse without amp, or with an exact engine")
    if precision.dtype != torch.float64 or model is None or inputs is None or jet_rules(model):
        return
    if lowered := model.lower_precision(inputs):
        raise ValueError(
            f"finite differences in float64: this model computes {', '.join(lowered)} below float64, so its "
            "gradients are rounded there and their differences are not float64 derivatives; use engine "
            "double_backward or pearlmutter, unsharded (sharded, such a model has only finite differences), "
            "or analyse in float32"
        )


def pad_sequences(tokens: torch.Tensor, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut (n, T+1) token rows into (inputs, targets) micro-batches of exactly ``batch_size`` rows;
    the last is padded with rows whose targets are all ignored (zero loss, zero gradient). Every
    micro-batch, padded or not, is a view with the strides of the rows, (T+1, 1), so one compiled
    graph serves all (and no copy of the epoch is made)."""
    batches = []
    for start in range(0, len(tokens), batch_size):
        rows = tokens[start : start + batch_size]
        if len(rows) < batch_size:
            x, y = torch.zeros(2, batch_size, rows.size(1), dtype=rows.dtype, device=rows.device).unbind()
            x[: len(rows)], y[: len(rows)] = rows, rows
            y[len(rows) :] = IGNORE_INDEX
            batches.append((x[:, :-1], y[:, 1:]))
        else:
            batches.append((rows[:, :-1], rows[:, 1:]))
    return batches


class CurvatureOperator(Protocol):
    """What the statistics and spectra ask of an epoch Hessian, held whole (``EpochHessian``) or
    sharded over the ranks (``tiny_llm.curvature.sharded.ShardedHessian``): the same interface, so
    no part asks which it has. Vectors are the whole (K, D) directions, or this rank's shards."""

    engine: str
    """The engine it runs (a name of the registry)."""
    precision: Precision
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    """The epoch's curvature micro-batches (inputs, targets), the last padded."""
    n_targets: int
    """The epoch's target tokens (the mean's denominator)."""
    passes: int
    """Passes over the epoch so far."""

    def quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv for the rows of V: (K,) float64."""

    def split_quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv and its Gauss–Newton part for the rows of V (forms engines): (2, K) float64."""

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """H V for the rows of V (products engines), float64."""


class EpochHessian:
    """The full-epoch token-mean Hessian at the model's current parameters.

    Args:
        model: a ``Llama`` with reference attention, in the analysis dtype, on the analysis device.
        tokens: (n, T+1) int64 token rows of the epoch (every row's T targets count).
        batch_size: curvature micro-batch size (``--hvp-batch-size``); changes only how the
            epoch is cut, not H.
        engine: the name of an engine of :mod:`tiny_llm.curvature.engines`: ``taylor`` or
            ``adjoint`` (quadratic forms only), ``double_backward``, ``pearlmutter`` or
            ``finite_difference`` (Hessian-vector products).
        precision: dtype / device / AMP policy.
        directions_per_pass: K, the number of directions sharing one pass over the data.
        compile: compile the Pearlmutter micro-batch product with ``torch.compile``.
        group_rows: at most this many sequences of a curvature micro-batch per pass of an engine
            (None: the engine's default, the whole micro-batch; taylor mode B/K). Memory of a pass
            grows with it; the forms and products do not change (the loss is a sum over
            sequences, and each group adds its share). Compiled, groups are equal (a divisor of
            the micro-batch), so one graph serves them.
        head_tokens: every engine (``Engine.head_chunks``) takes the output head and loss of a
            model of this project's this many target positions at a time (None: a group's at
            once); as ``group_rows``, memory only.

    Example:
        >>> from tiny_llm.config import ModelConfig
        >>> model = Llama(ModelConfig(vocab_size=8, d_model=4, n_heads=2, d_ff=8, n_layers=1)).double()
        >>> H = EpochHessian(model, torch.randint(0, 8, (3, 5)), batch_size=2, engine="double_backward",
        ...                  precision=Precision(torch.device("cpu"), torch.float64))
        >>> H.quadratic_forms(torch.zeros(2, H.flat.D, dtype=torch.float64)).tolist()
        [0.0, 0.0]
    """

    def __init__(
        self,
        model: Llama,
        tokens: torch.Tensor,
        *,
        batch_size: int,
        engine: str,
        precision: Precision,
        directions_per_pass: int = 1,
        compile: bool = False,
        progress: Callable[[str], None] | None = None,
        group_rows: int | None = None,
        head_tokens: int | None = None,
        placement: Placement | None = None,
    ):  # 11 parameters, keyword-only past the data: the engine and the cuts a job's memory plan sets

        self.spec = engine_named(engine)
        self.placement = placement or place(model)
        self.spec.check_placement(self.placement.name)
        if self.spec.second_derivatives and model.attention_backend != "reference":
            raise ValueError(
                "curvature needs reference attention (second derivatives); build "
                "Llama(config, attention_backend='reference'), or use an engine of first derivatives "
                f"({', '.join(e.name for e in REGISTRY.values() if not e.second_derivatives)})"
            )
        if compile and not self.spec.compiled:
            compiled = ", ".join(e.name for e in REGISTRY.values() if e.compiled)
            raise ValueError(f"only the {compiled} engine is compiled; use --no-compile-hvp with the other engines")
        for key, value in (("group_rows", group_rows), ("head_tokens", head_tokens)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{key}: expected a positive integer or None, got {value!r}")
        if self.spec.jets:
            check_jet_rules(model)
        self.group_rows, self.head_tokens = group_rows, head_tokens
        self.model, self.engine, self.precision = model, engine, precision
        self.K, self.compile = directions_per_pass, compile
        self.batches = pad_sequences(tokens.to(precision.device), batch_size)
        if not self.spec.second_derivatives:
            check_differences(precision, model, self.batches[0][0][:1])
        self.n_targets = int(tokens[:, 1:].numel())
        self.context = MicroBatchContext(model, self.placement, precision, self.n_targets, head_tokens, compile)
        """All an engine is given beside its directions and micro-batch (``MicroBatchContext``)."""
        self.flat = self.context.flat
        self.progress = progress or (lambda message: None)
        self.passes = 0
        self._batch = self.spec.compute()

    def batch_forms(self, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """vᵀH_b v for one curvature micro-batch (its share of the epoch loss), V (K, D) → (K,) float64."""
        if self.spec.products:
            return (V.double() * self.batch_products(V, inputs, targets).double()).sum(dim=1)
        return self.batch_split_forms(V, inputs, targets)[0]

    def batch_split_forms(self, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """vᵀH_b v and its generalised Gauss–Newton part vᵀG_b v for one curvature micro-batch,
        V (K, D) → (2, K) float64; quadratic-form engines (the loss rule computes vᵀGv on its
        way to vᵀHv, so the split costs nothing)."""
        if not self.spec.forms:
            raise ValueError(
                f"the Gauss–Newton split needs a quadratic-form engine ({', '.join(names('forms'))}), not {self.engine}"
            )
        forms = torch.zeros(2, len(V), dtype=torch.float64, device=self.precision.device)
        for rows in self._row_groups(len(V), len(inputs)):  # a group's adjoints are freed before the next's
            forms += self._batch(self.context, V, inputs[rows], targets[rows])
        return forms

    def _row_groups(self, K: int, B: int) -> list[slice]:
        """The sequences of one pass, as slices of the micro-batch: the engine's default group
        (the whole micro-batch, or B/K sequences for an engine that holds every coefficient of a
        layer for K directions at once, near one primal forward of the micro-batch in memory;
        cut finer, the adjoint engine's passes slow down on small models: 0.50 → 0.74 of a
        gradient per direction on the demo model), capped by ``group_rows`` for memory."""
        cap = min(self.spec.group_rows(K, B), self.group_rows or B)
        rows = group_sizes(B, cap, equal=bool(self.group_rows) and self.compile)[0]  # equal: one compiled graph
        return [slice(start, start + rows) for start in range(0, B, rows)]

    def batch_products(self, V: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """H_b V for one curvature micro-batch (its share of the epoch loss), V of shape (K, D)."""
        if not self.spec.products:
            raise ValueError(
                f"the {self.engine} engine computes quadratic forms vᵀHv only; Hessian-vector products "
                f"(spectra) need one of {', '.join(names('products'))}"
            )
        total = None
        for rows in self._row_groups(len(V), len(inputs)):
            part = self._batch(self.context, V, inputs[rows], targets[rows])
            total = part if total is None else total + part
        return total

    # --- passes over the epoch ---------------------------------------------------------------
    def _check(self, V: torch.Tensor) -> torch.Tensor:
        d = sum(self.placement.sizes)
        if V.dim() != 2 or V.size(1) != d:
            held = "" if d == self.flat.D else " (this rank's shard)"
            raise ValueError(f"directions must have shape (K, {d}){held}, got {tuple(V.shape)}")
        return V.to(device=self.precision.device, dtype=self.precision.dtype)

    def _passes(self, V: torch.Tensor, per_batch) -> Iterator[tuple[int, int, torch.Tensor]]:
        """Per pass of K directions and per micro-batch b, yield (first row, real rows,
        ``per_batch(chunk, inputs, targets)``). Compiled, a chunk of 2 to K − 1 directions is padded
        with zero directions to K (the graph of K serves it); a single direction (Lanczos, SLQ, CG)
        runs its own graph of one, at 1/K of the work and memory."""
        for start in range(0, len(V), self.K):
            chunk = V[start : start + self.K]
            real = len(chunk)
            if self.compile and 1 < real < self.K:  # one graph for K: pad a short chunk with zero directions
                chunk = torch.cat([chunk, chunk.new_zeros(self.K - real, chunk.size(1))])
            started = time.perf_counter()
            for inputs, targets in self.placement.deal(self.batches):  # this rank's micro-batches
                yield start, real, per_batch(chunk, inputs, targets)
            self.passes += 1
            self.progress(
                f"{self.engine} pass over {len(self.batches)} micro-batches for directions "
                f"{start + 1}-{start + real} of {len(V)} took {time.perf_counter() - started:.2f} s"
            )

    def quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """dᵀ H d for each row d of V (K', D), summed over micro-batches in float64."""
        V = self._check(V)
        out = torch.zeros(len(V), dtype=torch.float64, device=self.precision.device)
        for start, real, forms in self._passes(V, self.batch_forms):
            out[start : start + real] += forms[:real]
        return self.placement.reduce_forms(out)

    def split_quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """dᵀHd and its generalised Gauss–Newton part dᵀGd for each row d of V (K', D): (2, K')
        float64, in the same passes as ``quadratic_forms`` (an engine that declares a Gauss–Newton part)."""
        if not self.spec.gauss_newton:
            able = ", ".join(e.name for e in REGISTRY.values() if e.gauss_newton)
            raise ValueError(f"the Gauss–Newton split needs an engine that computes it ({able}), not {self.engine}")
        V = self._check(V)
        out = torch.zeros(2, len(V), dtype=torch.float64, device=self.precision.device)
        for start, real, forms in self._passes(V, self.batch_split_forms):
            out[:, start : start + real] += forms[:, :real]
        return self.placement.reduce_forms(out)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """H V for the rows of V (K', D), accumulated over micro-batches in float64."""
        V = self._check(V)
        out = torch.zeros(V.shape, dtype=torch.float64, device=self.precision.device)
        for start, real, HV in self._passes(V, self.batch_products):
            out[start : start + real] += HV[:real].double()
        return self.placement.reduce_products(out)


@contextlib.contextmanager
def runtime_settings(device: torch.device, tf32: bool) -> Iterator[dict[str, str]]:
    """Set the fp32 matmul precision for the analysis and restore the previous setting afterwards.

    Yields the settings actually in force (recorded in results).
    """
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    try:
        if device.type == "cuda":
            matmul.fp32_precision = "tf32" if tf32 else "ieee"
        yield {"cuda_matmul_fp32_precision": matmul.fp32_precision}
    finally:
        matmul.fp32_precision = previous
