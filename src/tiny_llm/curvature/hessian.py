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
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch.func import functional_call

from tiny_llm.architectures import jet_rules
from tiny_llm.curvature.engines import AMP_DIFFERENCES, group_sizes, names
from tiny_llm.curvature.engines import ENGINES as REGISTRY
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.placement import Placement, place
from tiny_llm.model.causal import IGNORE_INDEX, check_jet_rules, token_losses
from tiny_llm.model.llama import Llama
from tiny_llm.model.micro_batch import Precision
from tiny_llm.model.micro_batch import gradient as micro_batch_gradient

__all__ = ["CurvatureOperator", "EpochHessian", "FlatParameters", "Precision", "check_differences", "pad_sequences"]

log = logging.getLogger(__name__)

FD_SCALE = {torch.float64: 1e-6, torch.float32: 3e-4}
"""Default relative step of the finite-difference engine per dtype: ε = scale · max(1, ‖θ‖) / ‖v‖
(chosen from the measured truncation / round-off trade-off, benchmarks/README.md)."""


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


class FlatParameters:
    """Map between a model's parameters and one flat vector of length D (tied weights once)."""

    def __init__(self, model: torch.nn.Module):
        named = list(model.named_parameters())  # named_parameters() already skips tied duplicates
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.D = sum(self.sizes)

    def flatten(self, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def flatten_state(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.flatten([state[n] for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.view(s) for n, t, s in zip(self.names, flat.split(self.sizes, dim=-1), self.shapes, strict=True)}

    def blocks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Split (K, D) into per-parameter (K, n_p) views."""
        return list(flat.split(self.sizes, dim=-1))


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


class _HiddenAndHead(torch.nn.Module):
    """A model's final hidden state and output head as one module's output, for ``functional_call``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.hidden(inputs), self.model.head_weight


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
        self.flat = FlatParameters(model)
        theta = self.placement.flatten([p.detach() for p in model.parameters()])
        self.theta_norm = self.placement.norms(theta[None])[0]  # the finite differences' step scale
        self.batches = pad_sequences(tokens.to(precision.device), batch_size)
        if not self.spec.second_derivatives:
            check_differences(precision, model, self.batches[0][0][:1])
        self.n_targets = int(tokens[:, 1:].numel())
        self.n_targets_tensor = torch.tensor(float(self.n_targets), dtype=precision.dtype, device=precision.device)
        self.progress = progress or (lambda message: None)
        self.passes = 0
        self.fd_scale = FD_SCALE.get(precision.dtype, 3e-3)
        self.workspace: dict[str, torch.Tensor] = {}
        """Buffers the jet engines keep between groups."""
        self.functions: dict[str, Callable] = {}
        """Functions an engine builds once per operator (the compiled Pearlmutter product)."""
        self._batch = self.spec.compute()
        self._hidden_and_head: _HiddenAndHead | None = None

    @functools.cached_property
    def theta(self) -> torch.Tensor:
        """θ as one flat vector, as this placement holds it, made on first use (the Pearlmutter
        product's point): the engines that do not ask hold no copy of the parameters."""
        return self.placement.flatten([p.detach() for p in self.model.parameters()])

    # --- one micro-batch ---------------------------------------------------------------------
    def loss(
        self,
        params: dict[str, torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        n_targets: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This micro-batch's share of the epoch loss at ``params`` (a functional call)."""
        logits = self.precision.forward(lambda x: functional_call(self.model, params, (x,)), inputs)
        return token_losses(logits, targets).sum() / (self.n_targets if n_targets is None else n_targets)

    def hidden_and_head(
        self, params: dict[str, torch.Tensor], inputs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The final hidden state (B, T, C) and the output head (V, C) at ``params`` (a functional
        call of a model of this project's, under the forward's autocast)."""
        if self._hidden_and_head is None:
            self._hidden_and_head = _HiddenAndHead(self.model)
        with self.precision.autocast():
            return functional_call(self._hidden_and_head, {f"model.{n}": p for n, p in params.items()}, (inputs,))

    def head_chunked(self, targets: torch.Tensor) -> bool:
        """Whether this group's head and loss run in token chunks: ``head_tokens`` set, fewer than
        the group's targets, a model with second-order rules (which has ``hidden``) and a placement
        that allows it (``Placement.head_chunks``)."""
        chunks = self.head_tokens is not None and self.head_tokens < targets.numel()
        return chunks and self.placement.head_chunks and jet_rules(self.model)

    def gradient_at(
        self, inputs: torch.Tensor, targets: torch.Tensor, step: torch.Tensor | None = None
    ) -> torch.Tensor:
        """∇ of this micro-batch's share of the epoch loss at θ + ``step`` (None: at θ; the placement
        shifts and restores θ), as this placement holds vectors (a rank's shard when sharded: FSDP
        reduce-scatters the gradient of every rank's micro-batch of the round). With
        ``head_tokens`` (``head_chunked``) the head and loss run that many target positions at a
        time: the same sums."""
        model = self.model
        head_tokens = self.head_tokens if self.head_chunked(targets) else None
        with self.placement.shifted(step):
            model.zero_grad(set_to_none=True)
            micro_batch_gradient(model, inputs, targets, self.n_targets, self.precision, head_tokens)
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
            gradient = self.placement.flatten(grads)
            model.zero_grad(set_to_none=True)
        return gradient

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
            forms += self._batch(self, V, inputs[rows], targets[rows])
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
            part = self._batch(self, V, inputs[rows], targets[rows])
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
