"""What every causal language model here shares: the base class ``CausalLM`` (the token embedding,
the output head tied to it or not, the initialisation, the length check and the loss's second-order
rule), the per-token loss with ignored targets, the check that every layer has a jet rule, and the
precision helpers of the reductions (norms, softmax, cross-entropy never in bf16).

A new architecture subclasses ``CausalLM`` in its own module (docs/architecture.md: "A new
architecture").
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.jets import Jet, JetPass, per_direction, per_direction_dot

__all__ = [
    "IGNORE_INDEX",
    "WHOLE_HEAD",
    "AttentionBackend",
    "CausalLM",
    "VocabularyRows",
    "check_jet_rules",
    "count_parameters",
    "head_loss_chunks",
    "loss_jet_rows",
    "row_dots",
    "token_losses",
    "upcast",
    "without_autocast",
]


IGNORE_INDEX = -100
"""Target id of padded positions: they contribute zero loss and no gradient."""


AttentionBackend = Literal["reference", "sdpa"]


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least float32: reductions (norms, softmax, cross-entropy) never run in bf16/fp16."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def without_autocast(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Disable autocast for the device of ``x`` (keeps explicit fp32 regions fp32 under --amp)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


class CausalLM(nn.Module):
    """What every architecture here shares: the output head (tied to the token embedding or not),
    the length check, and the loss's second-order rule. A subclass defines ``tok_embeddings``,
    ``output`` (None when tied), ``forward(idx)`` and ``jet(idx, jets)`` (the jet of the final
    normalised hidden state)."""

    config: ModelConfig
    attention_backend: AttentionBackend

    def _begin(self, config: ModelConfig, attention_backend: AttentionBackend) -> None:
        """The first modules of every architecture (the token embedding), after the backend check."""
        if attention_backend not in ("reference", "sdpa"):
            raise ValueError(f"attention_backend: expected 'reference' or 'sdpa', got {attention_backend!r}")
        self.config, self.attention_backend = config, attention_backend
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)

    def _end(self) -> None:
        """The last module (an untied head; tied: logits use tok_embeddings.weight directly, so the
        state dict holds the tensor once), then the initialisation."""
        self.output = (
            None if self.config.tie_embeddings else nn.Linear(self.config.d_model, self.config.vocab_size, bias=False)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: weights N(0, 0.02), residual projections (wo, w2) N(0, 0.02/√(2 n_layers)),
        norm weights 1, biases 0."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, std=0.02)

    def _check_length(self, T: int) -> None:
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds model.max_seq_len={self.config.max_seq_len}")

    def _check_jet_backend(self) -> None:
        if self.attention_backend != "reference":
            raise ValueError(
                f"jets need reference attention; build {type(self).__name__}(config, attention_backend='reference')"
            )

    @property
    def head_weight(self) -> torch.Tensor:
        """The output projection (V, C): the embedding when tied."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) of the final normalised hidden state h (B, T, C)."""
        return F.linear(h, self.head_weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) of token ids (B, T)."""
        return self.logits(self.hidden(idx))

    def loss_jet(self, h: Jet, targets: torch.Tensor, jets: JetPass) -> torch.Tensor:
        """d²/dt² of Σ_t ℓ_t (summed cross-entropy of the non-ignored targets), shape (K,).

        With logits z = hEᵀ (E(t) = E + tU), p = softmax(z0) and r = p − e_y:
        ℓ2 = ⟨r, z2⟩ + ⟨p, z1²⟩ − ⟨p, z1⟩², where ⟨r, z2⟩ = ⟨rE, h2⟩ + 2⟨rU, h1⟩: z2 is never formed.
        The second part, z1ᵀ(diag(p) − ppᵀ)z1 summed over tokens, is the generalised Gauss–Newton
        form vᵀGv (G = Jᵀ ∇²ℓ J, J the Jacobian of the logits); it is left in ``jets.gauss_newton``.

        Every term is a sum over target positions: with ``jets.head_tokens`` they are taken that
        many positions at a time, so that no (K, positions, V) tangent of the whole group is held.
        """
        weight = self.head_weight  # (V, C)
        U = jets.direction(weight)  # (K, V, C)
        K, V, C = U.shape
        N = targets.numel()
        chunk = min(N, jets.head_tokens or N)
        h0, h1 = h.z0.reshape(N, C), h.z1.reshape(K, N, C)
        h2 = None if h.z2 is None else h.z2.reshape(K, N, C)
        y = targets.reshape(N)
        total, gauss_newton = 0, 0
        for start in range(0, N, chunk):
            rows = slice(start, start + chunk)
            scratch = jets.buffer("logits z1", (K * chunk * V,), h1)
            jet = (h0[rows], h1[:, rows], None if h2 is None else h2[:, rows])
            form, curvature = loss_jet_rows(jet, y[rows], weight, U, scratch=scratch)
            total, gauss_newton = total + form, gauss_newton + curvature
        jets.gauss_newton = gauss_newton
        return total


@dataclass(frozen=True)
class VocabularyRows:
    """The rows of the vocabulary (of the head) a process holds, and the collectives over the
    processes that hold the others: the whole head on one process (every collective the identity),
    or each rank's rows of a head cut over ``ranks`` processes, for the tokens of rank ``source``."""

    first: int = 0
    """The first row held."""
    rank: int = 0
    ranks: int = 1
    source: int = 0
    """The rank whose tokens these are (which receives the per-token sums)."""

    def softmax(self, z0: torch.Tensor) -> torch.Tensor:
        """softmax over every process's rows of the logits z0 (n, rows held)."""
        if self.ranks == 1:
            return torch.softmax(z0, dim=-1)
        top = z0.amax(-1) if z0.size(-1) else z0.new_full(z0.shape[:1], float("-inf"))
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        p = torch.exp(z0 - top.unsqueeze(-1))
        summed = p.sum(-1, keepdim=True)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return p / summed

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """A sum over the vocabulary from each process's share of it, on every process."""
        if self.ranks > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def at_source(self, x: torch.Tensor) -> torch.Tensor | None:
        """A sum over the vocabulary on the tokens' own rank (None elsewhere)."""
        if self.ranks > 1:
            dist.reduce(x, dst=self.source)
        return x if self.rank == self.source else None


WHOLE_HEAD = VocabularyRows()
"""The whole head on one process."""


def loss_jet_rows(
    jet: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    targets: torch.Tensor,
    E: torch.Tensor,
    U: torch.Tensor,
    rows: VocabularyRows = WHOLE_HEAD,
    scratch: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss's second-order rule (``CausalLM.loss_jet``) on n target positions: their (form,
    Gauss–Newton part), (K,) each, from the final hidden state's jet (h0 (n, C), h1 and h2 (K, n, C)),
    over the head rows ``rows`` holds (E (rows, C), their directions U (K, rows, C)); with the head cut
    over ranks, each rank's share of both, whose sum over the ranks is the whole. z1 may be written
    into ``scratch`` (K · n · rows elements or more)."""
    h0, h1, h2 = jet
    K, held, _ = U.shape
    n = h0.size(0)
    z0 = F.linear(h0, E)  # (n, rows held)
    # z1 = h1Eᵀ + h0Uᵀ, (K, n, rows): the shared head's product for all K directions at once, then
    # each direction's h0Uₖᵀ added in place (neither E nor U is copied K or 2 times).
    z1 = torch.matmul(h1, E.t(), out=None if scratch is None else scratch[: K * n * held].view(K, n, held))
    z1 = per_direction(h0, U, out=z1)
    with without_autocast(z0):
        keep = (targets != IGNORE_INDEX).reshape(-1, 1)  # (n, 1)
        p = rows.softmax(upcast(z0)) * keep  # ignored rows: 0
        Et, Ut = E.to(p.dtype), U.transpose(1, 2).to(p.dtype)
        h1, z1 = upcast(h1), upcast(z1)
        p_z1 = rows.total(row_dots(z1, p))  # ⟨p, z1⟩ by row, (K, n): from z1 itself, not two more head products
        # Σ p (z1 − ⟨p, z1⟩)², centred in place: not ⟨p, z1²⟩ − ⟨p, z1⟩², whose two large terms
        # cancel (at a 50k vocabulary in float32 that difference kept three digits).
        curvature = per_direction_dot(z1.sub_(p_z1.unsqueeze(-1).to(z1.dtype)).square_(), p)
        r = p.clone()  # p − e_y, e_y on the process that holds row y
        here = ((targets >= rows.first) & (targets < rows.first + held) & keep.view(-1)).nonzero().view(-1)
        r[here, targets[here] - rows.first] -= 1
        # rU and rE summed over the rows before they meet h1 and h2, on the tokens' own rank: p's
        # part and e_y's cancel, and each rank's share alone would carry the rounding of the larger
        # uncancelled terms into the form
        rU = rows.at_source(per_direction(r, Ut))
        first = 2 * per_direction_dot(rU, h1, overwrite=True) if rU is not None else torch.zeros_like(curvature)
        if h2 is not None:
            rE = rows.at_source(r @ Et)
            if rE is not None:
                first = first + per_direction_dot(upcast(h2), rE)
    return first + curvature, curvature


ROW_DOT_ELEMENTS = 1 << 22
"""Most elements of the temporary products ``row_dots`` forms at once (16 MiB in float32)."""


def row_dots(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """⟨pₜ, zₖₜ⟩ over the last axis: z (K, n, V), p (n, V) → (K, n), a few rows at a time so that
    the products never exceed ``ROW_DOT_ELEMENTS`` (one pass over z, where p E and the K products
    p Uₖ would cost two head matrix products per direction)."""
    K, n, V = z.shape
    out = z.new_empty(K, n)
    rows = max(1, ROW_DOT_ELEMENTS // max(1, K * V))
    for a in range(0, n, rows):
        torch.sum(z[:, a : a + rows] * p[a : a + rows], dim=-1, out=out[:, a : a + rows])
    return out


def head_loss_chunks(
    model: CausalLM, h: torch.Tensor, targets: torch.Tensor, scale: float, tokens: int, parameter_grads: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output head and loss ``scale · Σ ℓ`` of the final hidden state h (B, T, C), ``tokens``
    target positions at a time, so that only one chunk's logits exist at once: returns the loss
    (float64) and its gradient with respect to h, for ``h.backward`` to carry through the layers.
    With ``parameter_grads`` each chunk's backward also adds the head weight's gradient into its
    ``.grad`` (a gradient pass); without, nothing is accumulated (the adjoint record pass). The
    same terms as the whole (B·T, V) at once, summed chunk by chunk. Call it under the pass's
    autocast, as the logits would be."""
    flat, y = h.detach().reshape(-1, h.size(-1)), targets.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    grads = []
    for start in range(0, y.numel(), tokens):
        part = flat[start : start + tokens].requires_grad_()
        loss = token_losses(model.logits(part), y[start : start + tokens]).sum() * scale
        if parameter_grads:
            loss.backward()
            grads.append(part.grad)
        else:
            grads.extend(torch.autograd.grad(loss, part))
        total += loss.detach().double()
    return total, torch.cat(grads).view_as(h).to(h.dtype)


_JET_LEAVES = (nn.Linear, nn.Embedding, nn.ModuleList)
"""Layer types whose rule is a function (``linear_jet``, ``embedding_jet``) or that hold layers;
every other layer type has a rule when it defines a ``jet`` method beside its ``forward``."""


def check_jet_rules(model: nn.Module) -> None:
    """Refuse a model that has a layer without a second-order rule, before any work.

    Raises:
        ValueError: naming the layer, its type and what to do.
    """
    from tiny_llm.architectures import JET_REFUSAL, jet_rules  # the registry builds this module's models

    if not jet_rules(model):
        raise ValueError(JET_REFUSAL)
    for name, module in model.named_modules():
        if not isinstance(module, _JET_LEAVES) and not callable(getattr(type(module), "jet", None)):
            raise ValueError(
                f"layer {name or '<model>'} ({type(module).__name__}) has no second-order rule, so the "
                "taylor and adjoint engines cannot differentiate it; add its jet rule beside the layer "
                "(tiny_llm/model/) or use engine double_backward or pearlmutter"
            )
    if getattr(model, "attention_backend", "reference") != "reference":
        raise ValueError(
            f"jets need reference attention; build {type(model).__name__}(config, attention_backend='reference')"
        )


def token_losses(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token cross-entropy (B, T) in at least float32; ignored targets give exactly 0.

    Example:
        >>> token_losses(torch.zeros(1, 2, 4), torch.tensor([[3, IGNORE_INDEX]]))
        tensor([[1.3863, 0.0000]])
    """
    with without_autocast(logits):
        flat = upcast(logits).flatten(0, -2)
        losses = F.cross_entropy(flat, targets.flatten(), reduction="none", ignore_index=ignore_index)
    return losses.view(targets.shape)


def count_parameters(model: nn.Module) -> int:
    """D: unique trainable parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
