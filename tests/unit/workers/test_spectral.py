"""The spectral measurement of one (state, case) against the dense float64 Hessian of the tiny
model: the top eigenvalues (largest algebraic and largest magnitude) and the damped solve
ḡᵀ(H + λI)⁻¹ḡ; and the Lanczos tolerance in force."""

import dataclasses

import torch
from oracles import adam_diagonal, dense_epoch_hessian, dense_model, dense_tokens

from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.model.causal import token_losses
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings
from tiny_llm.workers.spectral import SpectrumJob, lanczos_tolerance, measure_spectrum

CPU64 = Precision(torch.device("cpu"), torch.float64)


def test_the_spectrum_of_one_state_is_the_dense_hessians():
    model, tokens = dense_model(), dense_tokens()
    H = dense_epoch_hessian(model, tokens)
    eigenvalues = torch.linalg.eigvalsh(H)
    loss = token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()
    g = FlatParameters(model).flatten(list(torch.autograd.grad(loss, list(model.parameters()))))
    spectrum = SpectrumSettings(top_k=2, lanczos_steps=300, slq_vectors=1, slq_steps=4, cg_max_iterations=2000)
    job = SpectrumJob(AnalysisSettings(dtype="float64"), spectrum, CPU64, 7, "double_backward", False, 7)
    measured = measure_spectrum(model, [tokens], job)
    top = [pair["eigenvalue"] for pair in measured["top_eigenvalues"]]
    torch.testing.assert_close(torch.tensor(top, dtype=torch.float64), eigenvalues.flip(0)[:2], rtol=1e-8, atol=0)
    magnitude = eigenvalues[eigenvalues.abs().argsort(descending=True)][:2]
    found = torch.tensor([pair["eigenvalue"] for pair in measured["top_magnitude_eigenvalues"]], dtype=torch.float64)
    torch.testing.assert_close(found, magnitude, rtol=1e-8, atol=0)
    cg = measured["cg"]
    damped = H + cg["damping"] * torch.eye(len(H), dtype=torch.float64)
    assert cg["status"] == "ok" and abs(cg["g_inverse_g"] - float(g @ torch.linalg.solve(damped, g))) < 1e-8 * abs(
        cg["g_inverse_g"]
    )
    assert measured["counts"]["parameters_D"] == len(H) and measured["lanczos"]["converged"]


def test_the_tolerance_is_the_setting_or_the_dtypes_default():
    assert lanczos_tolerance(SpectrumSettings(), torch.float64) == 1e-6
    assert lanczos_tolerance(SpectrumSettings(), torch.float32) == 1e-3
    assert lanczos_tolerance(SpectrumSettings(lanczos_tolerance=1e-9), torch.float32) == 1e-9


def test_the_preconditioned_sharpness_is_the_top_of_p_half_h_p_half():
    """With the optimizer's P (a real AdamW state after a few steps), the top eigenvalues of
    P^{1/2}HP^{1/2} (= those of PH) against eigh of the dense matrix; the plain ones unchanged."""
    model, tokens = dense_model(), dense_tokens()
    H = dense_epoch_hessian(model, tokens)
    P = adam_diagonal(model, [tokens[:4], tokens[4:]])
    s = P.sqrt()
    eigenvalues = torch.linalg.eigvalsh(s[:, None] * H * s[None, :])
    assert P.max() / P.min() > 10  # a preconditioner far from a multiple of I
    spectrum = SpectrumSettings(top_k=2, lanczos_steps=300, slq_vectors=1, slq_steps=4, cg_max_iterations=5)
    job = SpectrumJob(AnalysisSettings(dtype="float64"), spectrum, CPU64, 7, "double_backward", False, 7, None, None, P)
    measured = measure_spectrum(model, [tokens], job)
    preconditioned = measured["preconditioned"]
    top = torch.tensor([pair["eigenvalue"] for pair in preconditioned["top_eigenvalues"]], dtype=torch.float64)
    torch.testing.assert_close(top, eigenvalues.flip(0)[:2], rtol=1e-10, atol=0)
    magnitude = eigenvalues[eigenvalues.abs().argsort(descending=True)][:2]
    found = [pair["eigenvalue"] for pair in preconditioned["top_magnitude_eigenvalues"]]
    torch.testing.assert_close(torch.tensor(found, dtype=torch.float64), magnitude, rtol=1e-10, atol=0)
    assert preconditioned["lanczos"]["converged"]
    plain = torch.tensor([pair["eigenvalue"] for pair in measured["top_eigenvalues"]], dtype=torch.float64)
    torch.testing.assert_close(plain, torch.linalg.eigvalsh(H).flip(0)[:2], rtol=1e-8, atol=0)


def test_the_next_steps_preconditioner_is_the_one_adam_takes_from_the_state():
    """spectrum.preconditioner: next. An AdamW state after 3 steps takes one more step with the
    full-batch gradient ḡ at θ as its gradient: the P that step applies (read from torch's own
    moments) is the one whose P^{1/2}HP^{1/2} the spectrum measures, from the applied P and ḡ alone."""
    from tiny_llm.architectures import build_model
    from tiny_llm.model.moments import moments_from_optimizer, next_preconditioner, preconditioner

    model, tokens = dense_model(), dense_tokens()
    flat = FlatParameters(model)
    copy = build_model(model.config, attention_backend="reference").double()
    copy.load_state_dict(model.state_dict())
    named = list(copy.named_parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p in named], "param_names": [n for n, _ in named]}], lr=0.05, betas=(0.9, 0.95)
    )
    for rows in (tokens[:4], tokens[4:], tokens[:4]):
        optimizer.zero_grad()
        token_losses(copy(rows[:, :-1]), rows[:, 1:]).mean().backward()
        optimizer.step()
    applied = preconditioner(moments_from_optimizer(optimizer.state_dict()))
    loss = token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()
    g_bar = dict(zip(flat.names, torch.autograd.grad(loss, list(model.parameters())), strict=True))
    for name, parameter in copy.named_parameters():
        parameter.grad = g_bar[name].clone()
    optimizer.step()
    taken = preconditioner(moments_from_optimizer(optimizer.state_dict()))
    P, following = (flat.flatten([d[n] for n in flat.names]) for d in (applied, taken))
    derived = next_preconditioner(P, flat.flatten([g_bar[n] for n in flat.names]), 3, 0.95, 1e-8)
    torch.testing.assert_close(derived, following, rtol=1e-10, atol=0)
    assert not torch.allclose(following, P, rtol=1e-3)
    H = dense_epoch_hessian(model, tokens)
    s = following.sqrt()
    eigenvalues = torch.linalg.eigvalsh(s[:, None] * H * s[None, :])
    spectrum = SpectrumSettings(top_k=2, lanczos_steps=300, slq_vectors=1, slq_steps=4, cg_max_iterations=5)
    job = SpectrumJob(AnalysisSettings(dtype="float64"), spectrum, CPU64, 7, "double_backward", False, 7, None, None, P)
    job = dataclasses.replace(job, following={"step": 3, "beta2": 0.95, "eps": 1e-8})
    measured = measure_spectrum(model, [tokens], job)["preconditioned"]
    top = torch.tensor([pair["eigenvalue"] for pair in measured["top_eigenvalues"]], dtype=torch.float64)
    torch.testing.assert_close(top, eigenvalues.flip(0)[:2], rtol=1e-9, atol=0)
