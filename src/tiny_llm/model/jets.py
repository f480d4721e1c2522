"""Second-order jets: the machinery the quadratic-form engines (taylor, adjoint) share.

Along a direction v of the parameters, every activation is a function of one scalar t,
z(θ + t v) = z0 + t·z1 + ½t²·z2 + O(t³), and the loss's z2 is the quadratic form vᵀHv. The
rule of each layer kind (in ``tiny_llm.model.llama``, beside the layer) maps input jets to output
jets. Generic bilinear products and the softmax are here.

Modes of a pass (``JetPass``):

* Taylor: z2 is carried to the loss.
* record: a primal-only pass (zero directions) under autograd that keeps the output of every
  named node, so that one reverse pass gives each node's adjoint λ = ∂L/∂y.
* adjoint: with those λ, a node hands on z2 = 0 and adds ⟨λ, Q⟩ instead, Q being the node's own
  second-order term; Q reaches the loss linearly, through λ, so the sum is exact. Generic nodes
  form Q and contract it (``emit``); the rules of the costly layers (linear, attention core,
  SwiGLU gate) contract ⟨λ, Q⟩ without forming Q where their inputs carry no z2 (``adjoint``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

__all__ = [
    "Jet",
    "JetPass",
    "add_terms",
    "directions_last",
    "elementwise_jet",
    "per_direction",
    "per_direction_dot",
    "shared_matmul",
    "wide_matmul",
]


@dataclass(frozen=True)
class Jet:
    """An activation along K parameter directions.

    ``z0`` (...) is the primal, shared by the K directions; ``z1`` and ``z2`` (K, ...) are the
    first and second derivatives in t at t = 0, one row per direction. ``z2 = None`` means zero
    (before any second-order term has entered, or after the adjoint mode absorbed it).
    """

    z0: torch.Tensor
    z1: torch.Tensor
    z2: torch.Tensor | None = None

    def map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> Jet:
        """Apply a linear map (reshape, transpose, scaling, RoPE) to every coefficient."""
        return Jet(f(self.z0), f(self.z1), None if self.z2 is None else f(self.z2))

    def __add__(self, other: Jet) -> Jet:
        return Jet(self.z0 + other.z0, self.z1 + other.z1, add_terms(self.z2, other.z2))


def add_terms(*terms: torch.Tensor | None) -> torch.Tensor | None:
    """Sum of the terms that are not None (None when all are)."""
    present = [t for t in terms if t is not None]
    return None if not present else present[0] if len(present) == 1 else sum(present[1:], present[0])


def elementwise_jet(
    a: Jet, f: Callable[[torch.Tensor], torch.Tensor], derivatives: Callable[[torch.Tensor], tuple]
) -> Jet:
    """f(a) for an elementwise f whose f′ and f″ are ``derivatives(a0)``: y1 = f′a1,
    y2 = f′a2 + f″a1². Without directions (the adjoint mode's record pass: K = 0) the derivatives,
    which only multiply empty tangents, are not computed."""
    if a.z1.size(0) == 0:
        return Jet(f(a.z0), a.z1, a.z2)
    d1, d2 = derivatives(a.z0)
    return Jet(f(a.z0), d1 * a.z1, add_terms(d2 * a.z1.square(), None if a.z2 is None else d1 * a.z2))


def per_direction(
    x: torch.Tensor, V: torch.Tensor, out: torch.Tensor | None = None, buffer: torch.Tensor | None = None
) -> torch.Tensor:
    """x Vₖᵀ for every direction k: x (..., n) shared, V (K, m, n) → (K, ..., m), contiguous.

    With ``out`` (K, ..., m), adds to it in place instead (one batched GEMM with β = 1: no
    temporary and no separate addition); with ``buffer``, writes the product into it.
    """
    K, m, n = V.shape
    M = x.numel() // n
    shared = x.reshape(1, M, n).expand(K, M, n).to(V.dtype if out is None else out.dtype)
    if out is None:
        return torch.bmm(shared, V.transpose(1, 2), out=buffer).view(K, *x.shape[:-1], m)
    out.view(K, M, m).baddbmm_(shared, V.transpose(1, 2).to(out.dtype))
    return out


def shared_matmul(A: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """A Xₖ for every direction k as one matmul that reads A once: A (..., m, r) shared,
    X (K, ..., r, n) → (K, ..., m, n)."""
    return wide_matmul(A, directions_last(X), X.size(0))


def directions_last(X: torch.Tensor) -> torch.Tensor:
    """X (K, ..., r, n) laid out as (..., r, K·n), the right operand of ``wide_matmul`` (one copy;
    rows along r stay rows, so a slice of them is a view)."""
    return X.movedim(0, -2).reshape(*X.shape[1:-1], X.size(0) * X.size(-1))


def wide_matmul(A: torch.Tensor, wide: torch.Tensor, K: int) -> torch.Tensor:
    """``shared_matmul`` of A (..., m, r) and X given as ``directions_last(X)`` → (K, ..., m, n)."""
    return (A @ wide).unflatten(-1, (K, wide.size(-1) // K)).movedim(-2, 0)


def per_direction_dot(a: torch.Tensor, b: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """⟨aₖ, bₖ⟩ over all axes but the first: a (K, ...) and b either (K, ...) with the same elements
    in the same order (any view) or shared (...) → (K,) in float64. The products are taken in at
    least float32 and summed in blocks of ``DOT_BLOCK`` whose sums are added in float64; the total
    stays float64, because the terms a form adds up cancel (a float32 total would keep its rounding,
    relative to the largest term). With ``overwrite`` (a is a temporary the caller no longer needs)
    the paired products are written into a."""
    wide = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    K = a.size(0)
    if b.numel() * K == a.numel() and b.numel() != a.numel():
        return _blocked_dot(a.to(wide).reshape(K, -1), b.to(wide).reshape(-1))
    if b.numel() != a.numel():
        raise ValueError(f"per_direction_dot: shapes {tuple(a.shape)} and {tuple(b.shape)} do not pair")
    b = b.to(wide).reshape(a.shape)
    if overwrite and a.dtype == wide and a.is_contiguous():
        products = a.mul_(b)
    else:
        products = torch.mul(a.to(wide), b)
    return _blocked_sum(products.reshape(K, -1))


DOT_BLOCK = 4096
"""Terms a dot product sums in its own dtype before the blocks are added in float64."""


def _blocked_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of x (K, L), in blocks of DOT_BLOCK terms added in float64: (K,) float64."""
    K, L = x.shape
    if L <= DOT_BLOCK or x.dtype == torch.float64:
        return x.sum(1).double()
    blocks, main = L // DOT_BLOCK, L - L % DOT_BLOCK
    total = x[:, :main].reshape(K, blocks, DOT_BLOCK).sum(2).double().sum(1)
    if main < L:
        total += x[:, main:].sum(1).double()
    return total


def _blocked_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (K, L) @ b (L,), in blocks of DOT_BLOCK terms whose sums are added in float64: (K,)
    float64. One float32 matrix-vector product over millions of terms (the logits' or the
    attention scores' of a long sequence at a real vocabulary) keeps about four digits; blocks
    keep the sum to a float32 rounding of each term."""
    K, L = a.shape
    if L <= DOT_BLOCK or a.dtype == torch.float64:
        return (a @ b).double()
    blocks, main = L // DOT_BLOCK, L - L % DOT_BLOCK
    parts = torch.bmm(a[:, :main].view(K, blocks, DOT_BLOCK).transpose(0, 1), b[:main].view(blocks, DOT_BLOCK, 1))
    total = parts.double().sum((0, 2))
    if main < L:
        total += (a[:, main:] @ b[main:]).double()
    return total


class JetPass:
    """The directions of a pass and its mode (see the module docstring).

    Args:
        directions: each parameter (by identity) → its K directions, shape (K, *parameter.shape).
        adjoints: adjoint mode: node key → λ, the adjoint of the node's output.
        record: record mode: keep each node's primal output in ``recorded``.
        workspace: buffers reused across passes (see ``buffer``).
    """

    def __init__(
        self,
        directions: dict[torch.Tensor, torch.Tensor],
        adjoints: dict[Hashable, torch.Tensor] | None = None,
        record: bool = False,
        workspace: dict[str, torch.Tensor] | None = None,
        head_tokens: int | None = None,
    ):
        self.directions, self.adjoints = directions, adjoints
        self.head_tokens = head_tokens
        """Target positions the loss rule takes at a time (None: the whole group at once)."""
        self.workspace = {} if workspace is None else workspace
        self.recorded: dict[Hashable, torch.Tensor] | None = {} if record else None
        self.absorbed: torch.Tensor | None = None
        """Σ ⟨λ, Q⟩ over the nodes absorbed so far, (K,)."""
        self.gauss_newton: torch.Tensor | None = None
        """The loss's Gauss–Newton part z1ᵀ ∇²ℓ(z) z1 of its d²/dt², (K,), set by the loss rule."""

    def direction(self, parameter: torch.Tensor) -> torch.Tensor:
        return self.directions[parameter]

    def direction_rows(self, parameter: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """U[:, idx], the rows ``idx`` of the parameter's K directions (an embedding's lookup):
        (K, *idx.shape, *parameter.shape[1:])."""
        return self.direction(parameter)[:, idx]

    def buffer(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor | None:
        """A reusable scratch tensor for the largest per-direction intermediates (``out=`` targets).

        On CPU a fresh tensor of many megabytes is new memory from the OS each time, and touching
        it first costs more than the arithmetic (8 ms against 0.13 ms for one 8 MB product,
        measured); the buffer is reused by every layer and pass of the same shape. None (a fresh
        tensor) while autograd records, which ``out=`` does not support.
        """
        if torch.is_grad_enabled():
            return None
        buffer = self.workspace.get(name)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self.workspace[name] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buffer

    def adjoint(self, key: Hashable, *inputs: Jet) -> torch.Tensor | None:
        """λ of node ``key`` when this pass absorbs there and no input carries z2 (the node's
        z2 is then its own second-order term, which the caller contracts with λ directly)."""
        if self.adjoints is None or any(j.z2 is not None for j in inputs):
            return None
        return self.adjoints.get(key)

    def absorb(self, forms: torch.Tensor) -> None:
        """Add a node's ⟨λ, Q⟩ (K,) to ``absorbed``, in float64: the nodes' terms cancel."""
        forms = forms.double()
        self.absorbed = forms if self.absorbed is None else self.absorbed + forms

    def emit(self, key: Hashable, out: Jet) -> Jet:
        """The jet node ``key`` hands on: recorded, or with its z2 absorbed (adjoint mode)."""
        if self.recorded is not None:
            self.recorded[key] = out.z0
            return out
        lam = None if self.adjoints is None or out.z2 is None else self.adjoints.get(key)
        if lam is None:
            return out
        self.absorb(per_direction_dot(out.z2, lam))
        return Jet(out.z0, out.z1)

    def product(self, a: Jet, b: Jet, op: Callable = torch.mul, key: Hashable | None = None) -> Jet:
        """z = a∘b for a bilinear ∘ (``torch.mul`` or ``torch.matmul``, broadcasting over K):
        z1 = a1∘b0 + a0∘b1, z2 = a2∘b0 + 2a1∘b1 + a0∘b2."""
        z0, z1 = op(a.z0, b.z0), op(a.z1, b.z0) + op(a.z0, b.z1)
        twice = op(2 * a.z1, b.z1) if a.z1.numel() <= b.z1.numel() else op(a.z1, 2 * b.z1)
        z2 = add_terms(twice, None if a.z2 is None else op(a.z2, b.z0), None if b.z2 is None else op(a.z0, b.z2))
        out = Jet(z0, z1, z2)
        return out if key is None else self.emit(key, out)

    def softmax(self, s: Jet) -> Jet:
        """p = softmax(s) along the last axis, ⟨·,·⟩ that axis's inner product, c = s1 − ⟨p0, s1⟩:
        p1 = p0 c, p2 = p1 c + p0 (s2 − ⟨p1, s1⟩ − ⟨p0, s2⟩). Masked entries: s0 = −∞ gives p0 = 0,
        so finite s1 and s2 there do not matter.
        """
        p0 = torch.softmax(s.z0, dim=-1)
        c = s.z1 - (p0 * s.z1).sum(-1, keepdim=True)
        p1 = p0 * c
        p1c = p1 * c
        inner = -p1c.sum(-1, keepdim=True)  # −⟨p1, s1⟩ = −⟨p0, c²⟩
        if s.z2 is not None:
            inner = inner + s.z2 - (p0 * s.z2).sum(-1, keepdim=True)
        return Jet(p0, p1, p1c.add_(p0 * inner))
