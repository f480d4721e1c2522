"""The output head and loss in token chunks for the Hessian-vector-product engines.

With logits z = hWᵀ of the final hidden state h (n, C) and the head W (V, C), p = softmax(z) and
r = s·(p − e_y) on the kept targets (s the loss's scale, 0 on ignored targets), the loss s·Σ ℓ has

* gradient: ∂/∂h = rW, ∂/∂W = rᵀh;
* second derivative along (δh, δW): with δz = δhWᵀ + hδWᵀ and δr = s·p ⊙ (δz − ⟨p, δz⟩) (the
  softmax's Jacobian, symmetric), ∂/∂h changes by δrW + rδW and ∂/∂W by δrᵀh + rᵀδh.

Both are sums over target positions, so they are taken ``tokens`` positions at a time: only one
chunk's (n, V) logits and their derivatives exist at once, where autograd would keep the whole
group's, and for a double-backward graph every chunk's, until the second derivative is taken.

* :func:`head_loss` (``double_backward``): an autograd function whose backward is itself an
  autograd function (the gradient above) whose backward is the second derivative above, so that
  reverse-over-reverse, batched over K directions, never records the logits.
* :func:`head_gradient` (``pearlmutter``): the gradient above written functionally, for
  ``torch.func.jvp`` (forward mode keeps no graph, so each chunk's tangents are freed with it)
  under ``vmap``.

Both use the same terms as ``token_losses`` over the whole (n, V) logits; tests hold them equal to
the unchunked engines to 1e-12 in float64. They run in at least float32 with autocast off (under
bf16 autocast the whole head's logits would be bf16: the chunked head is the more exact of the two).
"""

from __future__ import annotations

import torch

from tiny_llm.model.causal import IGNORE_INDEX, token_losses, upcast, without_autocast

__all__ = ["head_gradient", "head_loss"]


def _residual(x: torch.Tensor, W: torch.Tensor, y: torch.Tensor, scale: float | torch.Tensor):
    """p·keep (n, V) and r = s·keep·(p − e_y) of n positions, x (n, C) and W (V, C) in the dtype
    they are computed in (functional: no in-place operation, so that jvp and vmap pass through)."""
    keep = (y != IGNORE_INDEX).unsqueeze(-1)
    p = torch.softmax(x @ W.t(), dim=-1) * keep
    onehot = torch.zeros_like(p).scatter(-1, y.clamp(min=0).unsqueeze(-1), keep.to(p.dtype))
    return p, (p - onehot) * scale


def head_gradient(
    h: torch.Tensor, W: torch.Tensor, targets: torch.Tensor, scale: float | torch.Tensor, tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂/∂h, ∂/∂W) of s·Σ ℓ over the targets (h (B, T, C), W (V, C), targets (B, T)), ``tokens``
    positions at a time; written functionally (no in-place operation), for forward-mode
    differentiation under vmap. ∂/∂W is accumulated by fused ``addmm``: two (V, C) at once."""
    flat, y = upcast(h).reshape(-1, h.size(-1)), targets.reshape(-1)
    grads_h, grad_W, Wf = [], None, upcast(W)
    with without_autocast(h):
        for start in range(0, y.numel(), tokens):
            rows = slice(start, start + tokens)
            x = flat[rows]
            _, r = _residual(x, Wf, y[rows], scale)
            grads_h.append(r @ Wf)
            grad_W = r.t() @ x if grad_W is None else torch.addmm(grad_W, r.t(), x)
    return torch.cat(grads_h).view_as(h).to(h.dtype), grad_W.to(W.dtype)


def head_loss(h: torch.Tensor, W: torch.Tensor, targets: torch.Tensor, scale: float, tokens: int) -> torch.Tensor:
    """s·Σ ℓ of the logits hWᵀ over the targets (h (B, T, C), W (V, C), targets (B, T)), ``tokens``
    positions at a time in the forward pass and in its first and second derivatives (any number
    of batched directions). A 0-dim tensor in at least float32, accumulated in float64."""
    return _HeadLoss.apply(h, W, targets, scale, tokens)


class _HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, targets, scale, tokens):
        ctx.save_for_backward(h, W, targets)
        ctx.scale, ctx.tokens = scale, tokens
        flat, y, Wf = upcast(h).reshape(-1, h.size(-1)), targets.reshape(-1), upcast(W)
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        with without_autocast(h):
            for start in range(0, y.numel(), tokens):
                rows = slice(start, start + tokens)
                total += token_losses(flat[rows] @ Wf.t(), y[rows]).sum(dtype=torch.float64)
        return (total * scale).to(torch.promote_types(h.dtype, torch.float32))

    @staticmethod
    def backward(ctx, grad_loss):
        h, W, targets = ctx.saved_tensors
        grad_h, grad_W = _HeadGradient.apply(h, W, grad_loss, targets, ctx.scale, ctx.tokens)
        return grad_h, grad_W, None, None, None


class _HeadGradient(torch.autograd.Function):
    """(∂/∂h, ∂/∂W) of g·s·Σ ℓ (g the incoming gradient of the loss), with its own derivative."""

    @staticmethod
    def forward(ctx, h, W, grad_loss, targets, scale, tokens):
        ctx.save_for_backward(h, W, grad_loss, targets)
        ctx.scale, ctx.tokens = scale, tokens
        ctx.set_materialize_grads(False)
        flat, y, Wf = upcast(h).reshape(-1, h.size(-1)), targets.reshape(-1), upcast(W)
        grad_h, grad_W = torch.empty_like(flat), None  # written in place: one (V, C) at a time
        with without_autocast(h):
            for start in range(0, y.numel(), tokens):
                rows = slice(start, start + tokens)
                x = flat[rows]
                _, r = _residual(x, Wf, y[rows], scale)
                torch.matmul(r, Wf, out=grad_h[rows])
                grad_W = r.t() @ x if grad_W is None else grad_W.addmm_(r.t(), x)
        g = grad_loss.to(grad_W.dtype)
        return grad_h.mul_(g).view_as(h).to(h.dtype), grad_W.mul_(g).to(W.dtype)

    @staticmethod
    def backward(ctx, u_h, u_W):
        """Along the cotangents (u_h, u_W) of the gradient: the head's second derivative along
        them (scaled by g) for h and W, and ⟨r, δz⟩/g's sum, the derivative in g."""
        h, W, grad_loss, targets = ctx.saved_tensors
        if u_h is None and u_W is None:
            return None, None, None, None, None, None
        flat, y, Wf = upcast(h).reshape(-1, h.size(-1)), targets.reshape(-1), upcast(W)
        u_flat = None if u_h is None else u_h.reshape(*u_h.shape[: -h.dim()], -1, h.size(-1))
        g = grad_loss.to(torch.promote_types(h.dtype, torch.float32))
        out_h, out_W, out_g = [], None, 0
        with without_autocast(h):
            for start in range(0, y.numel(), ctx.tokens):
                rows = slice(start, start + ctx.tokens)
                x = flat[rows]
                p, r = _residual(x, Wf, y[rows], ctx.scale)
                u = None if u_flat is None else u_flat[..., rows, :].to(p.dtype)
                dz = 0
                if u is not None:
                    dz = u @ Wf.t()
                if u_W is not None:
                    dz = dz + x @ u_W.to(p.dtype).transpose(-1, -2)
                out_g = out_g + (r * dz).sum((-1, -2), dtype=torch.float64)
                dr = p * (dz - (p * dz).sum(-1, keepdim=True)) * ctx.scale
                d_h = dr @ Wf
                if u_W is not None:
                    d_h = d_h + r @ u_W.to(p.dtype)
                out_h.append(d_h)
                # ∂/∂W accumulated in place (the first chunk's product carries the directions' batch)
                out_W = dr.transpose(-1, -2) @ x if out_W is None else out_W.addmm_(dr.transpose(-1, -2), x)
                if u is not None:
                    out_W = out_W.addmm_(r.t(), u)
        grad_h = torch.cat(out_h, dim=-2).mul_(g).to(h.dtype).view(*out_h[0].shape[:-2], *h.shape)
        return grad_h, out_W.mul_(g).to(W.dtype), out_g.to(grad_loss.dtype), None, None, None
