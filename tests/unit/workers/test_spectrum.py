"""The spectrum worker on a tiny trained run: top eigenvalue and CG against the dense Hessian,
reuse of identical results, refusal of changed spectral settings."""

import json
from pathlib import Path

import pytest
import torch
from builders import make_oracle_run, smallest_budget_gb
from safetensors.torch import load_file
from unit.workers.test_state import _dense_hessian

from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import train
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.spectrum import SpectrumSettings, analyze_spectrum, spectrum_settings_from_dict

SETTINGS = AnalysisSettings(noise_samples=2, device="cpu", dtype="float64", directions_per_pass=4)
SPECTRUM = SpectrumSettings(
    top_k=2, lanczos_steps=60, slq_vectors=2, slq_steps=8, block_samples=1, cg_rtol=1e-9, cg_max_iterations=400
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("spectrum")
    config = make_oracle_run(path)
    train(config, path / "run")
    return config, path


def test_spectrum_result_against_dense_oracle(run):
    config, path = run
    result = analyze_spectrum(path / "run", ["epoch-002.safetensors"], "seen", SETTINGS, SPECTRUM, path / "s.json")
    H, flat = _dense_hessian(config, load_file(path / "run" / "epoch-002.safetensors"), epoch_plan(config, 1))
    eig = torch.linalg.eigvalsh(H)
    assert result["top_eigenvalues"][0]["eigenvalue"] == pytest.approx(float(eig[-1]), rel=1e-8)
    assert result["top_eigenvalues"][0]["residual"] < 1e-6
    assert all(p["converged"] and p["tolerance"] == 1e-6 for p in result["top_eigenvalues"])
    assert result["lanczos"]["converged"] and result["lanczos"]["steps"] < SPECTRUM.lanczos_steps
    top_magnitude = float(eig[eig.abs().argmax()])
    assert result["top_magnitude_eigenvalues"][0]["eigenvalue"] == pytest.approx(top_magnitude, rel=1e-8)
    assert result["cg"]["damping"] == pytest.approx(2 * abs(top_magnitude), rel=1e-8)
    assert result["cg"]["relative_residual"] <= 1e-9 and result["cg"]["status"] == "ok"
    assert set(result["block_diagonal"]) == {"tensor", "layer"}
    assert json.loads((path / "s.json").read_text())["kind"] == "spectrum"


def _dense_gradient(config, state, plan):
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(state)
    tokens = torch.cat([TokenCache(config.data.cache).tokens(b) for b in plan.blocks])
    token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_shares_of_the_gradient_and_the_step_in_the_top_eigenspace_equal_the_dense_oracle(run):
    """Σ_j (u_jᵀx)² / ‖x‖² over the top-k eigenvectors u_j of the dense Hessian, for ḡ and for the
    step Δ = θ' − θ to the next checkpoint."""
    config, path = run
    successor = {"key": "next", "file": "epoch-002.safetensors", "step": 6}
    out = path / "step.json"
    result = analyze_spectrum(path / "run", ["epoch-001.safetensors"], "seen", SETTINGS, SPECTRUM, out, None, successor)
    state, following = (load_file(path / "run" / f"epoch-00{e}.safetensors") for e in (1, 2))
    H, flat = _dense_hessian(config, state, epoch_plan(config, 1))
    g = _dense_gradient(config, state, epoch_plan(config, 1))
    delta = flat.flatten([(following[n] - state[n]).double() for n in flat.names])
    top = torch.linalg.eigh(H).eigenvectors[:, -SPECTRUM.top_k :]
    alignment = result["alignment"]
    for vector, name in ((g, "gradient"), (delta, "step")):
        share = float(((top.T @ vector) ** 2).sum() / (vector @ vector))
        assert alignment[f"{name}_top_share"] == pytest.approx(share, rel=1e-6), name
        assert alignment[f"{name}_top"][0] == pytest.approx(
            float((top[:, -1] @ vector).abs() / vector.norm()), rel=1e-6
        )
    assert result["trajectory"] == {"successor": successor}
    with pytest.raises(ValueError, match=r"was measured along the step to \{'key': 'next'"):
        analyze_spectrum(path / "run", ["epoch-001.safetensors"], "seen", SETTINGS, SPECTRUM, out)


def test_reuse_and_refusal(run, monkeypatch):
    config, path = run
    out = path / "reuse.json"
    small = SpectrumSettings(top_k=1, lanczos_steps=4, slq_vectors=1, slq_steps=3, block_samples=1, cg_max_iterations=3)
    first = analyze_spectrum(path / "run", ["epoch-001.safetensors"], "unseen", SETTINGS, small, out)
    monkeypatch.setattr("tiny_llm.workers.spectrum.measure_spectrum", lambda *a, **k: pytest.fail("recomputed"))
    assert analyze_spectrum(path / "run", ["epoch-001.safetensors"], "unseen", SETTINGS, small, out) == first
    with pytest.raises(ValueError, match="use a new output directory"):
        analyze_spectrum(
            path / "run",
            ["epoch-001.safetensors"],
            "unseen",
            SETTINGS,
            SpectrumSettings(**{**small.__dict__, "lanczos_steps": 5}),
            out,
        )


def test_indefinite_cg_is_reported_not_fatal(run):
    config, path = run
    negative = SpectrumSettings(
        top_k=1, lanczos_steps=4, slq_vectors=1, slq_steps=3, block_samples=1, cg_damping=-1e6, cg_max_iterations=3
    )
    result = analyze_spectrum(path / "run", ["epoch-001.safetensors"], "seen", SETTINGS, negative, path / "neg.json")
    assert result["cg"]["status"] == "indefinite" and result["cg"]["g_inverse_g"] is None


def test_settings_are_checked():
    with pytest.raises(ValueError, match="spectrum.lanczos_steps: expected at least top_k=3"):
        SpectrumSettings(top_k=3, lanczos_steps=2)
    with pytest.raises(ValueError, match="unknown key spectrum.lanczos; allowed keys: spectrum.top_k"):
        spectrum_settings_from_dict({"enabled": True, "lanczos": 3})
    assert spectrum_settings_from_dict({"enabled": True, "top_k": 2}).top_k == 2


def test_cli_entry_point(run, capsys):
    from tiny_llm.cli import main

    config, path = run
    out = path / "cli-spectrum.json"
    code = main(
        [
            "--quiet",
            "analyze-spectrum",
            "--run",
            str(path / "run"),
            "--checkpoint",
            "epoch-002.safetensors",
            "--case",
            "seen",
            "--output",
            str(out),
            "--device",
            "cpu",
            "--dtype",
            "float64",
            "--top-k",
            "1",
            "--lanczos-steps",
            "5",
            "--slq-vectors",
            "1",
            "--slq-steps",
            "3",
            "--block-samples",
            "1",
            "--cg-max-iterations",
            "3",
            "--noise-samples",
            "1",
        ]
    )
    assert code == 0 and json.loads(out.read_text())["spectrum_settings"]["lanczos_steps"] == 5
    assert (
        main(
            [
                "analyze-spectrum",
                "--run",
                str(path / "run"),
                "--checkpoint",
                "epoch-002.safetensors",
                "--case",
                "seen",
                "--output",
                str(path / "bad.json"),
                "--top-k",
                "4",
                "--lanczos-steps",
                "2",
            ]
        )
        == 2
    )
    assert "expected at least top_k=4" in capsys.readouterr().err and not (path / "bad.json").exists()


def test_lanczos_storage_and_reduction_dtypes_are_the_configured_ones(run, monkeypatch):
    """bf16 storage with float32 reductions: every Lanczos run of the worker (top pairs and SLQ)
    gets both dtypes as configured, and the result records them."""
    import tiny_llm.curvature.spectrum as spectrum

    config, path = run
    seen, real = [], spectrum.lanczos

    def spy(matvec, start, steps, **kwargs):
        seen.append((kwargs["basis"].dtype, kwargs["basis"].reduction))
        return real(matvec, start, steps, **kwargs)

    monkeypatch.setattr(spectrum, "lanczos", spy)
    settings = SpectrumSettings(
        top_k=1,
        lanczos_steps=6,
        slq_vectors=2,
        slq_steps=4,
        block_samples=1,
        cg_max_iterations=3,
        lanczos_basis="bfloat16",
        lanczos_reduction="float32",
    )
    result = analyze_spectrum(path / "run", ["epoch-002.safetensors"], "seen", SETTINGS, settings, path / "bf16.json")
    assert seen == [(torch.bfloat16, torch.float32)] * 4  # top pairs, those of P^{1/2}HP^{1/2}, two SLQ vectors
    assert (result["precision"]["lanczos_basis"], result["precision"]["lanczos_reduction"]) == ("bfloat16", "float32")
    with pytest.raises(ValueError, match="spectrum.lanczos_reduction: expected one of 'float64', 'float32'"):
        SpectrumSettings(lanczos_reduction="bfloat16")


def test_out_of_memory_is_one_clear_error_and_nothing_is_written(run, monkeypatch):
    config, path = run

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("tiny_llm.workers.spectrum.measure_spectrum", out_of_memory)
    out = path / "oom" / "seen.json"
    with pytest.raises(ValueError, match="out of memory with --hvp-batch-size 2 and --directions-per-pass 4"):
        analyze_spectrum(path / "run", ["epoch-001.safetensors"], "seen", SETTINGS, SpectrumSettings(), out)
    assert not out.exists()


def test_a_memory_budget_cuts_the_products_without_changing_the_spectrum(run):
    """The smallest budget that admits one sequence per group of the largest pass gives the spectrum
    of the unchunked job (float64; Lanczos amplifies rounding only slightly over a few steps)."""
    from dataclasses import replace

    from tiny_llm.workers.loading import resolve_job
    from tiny_llm.workers.spectrum import spectrum_memory

    config, path = run
    small = SpectrumSettings(top_k=1, lanczos_steps=6, slq_vectors=1, slq_steps=4, block_samples=2, cg_max_iterations=5)
    whole = analyze_spectrum(path / "run", ["epoch-002.safetensors"], "seen", SETTINGS, small, path / "whole.json")
    n_batches = len(epoch_plan(config, 1))
    high = smallest_budget_gb(
        lambda gb: spectrum_memory(
            replace(SETTINGS, memory_budget_gb=gb), small, config, resolve_job(SETTINGS, config), n_batches
        )
    )
    cut = analyze_spectrum(
        path / "run",
        ["epoch-002.safetensors"],
        "seen",
        replace(SETTINGS, memory_budget_gb=high),
        small,
        path / "cut.json",
    )
    assert min(p["group_rows"] for p in cut["memory"]["passes"]) == 1
    assert cut["top_eigenvalues"][0]["eigenvalue"] == pytest.approx(
        whole["top_eigenvalues"][0]["eigenvalue"], rel=1e-12
    )
    assert cut["cg"]["g_inverse_g"] == pytest.approx(whole["cg"]["g_inverse_g"], rel=1e-10)
    assert cut["slq"]["trace_over_D"] == pytest.approx(whole["slq"]["trace_over_D"], rel=1e-12)


def test_the_default_lanczos_converges_and_a_low_cap_is_flagged(run, caplog):
    """With the default settings the top eigenvalues converge (to the dense spectrum) and say so;
    capped at 3 steps they do not, and the result, spectrum.csv and collection say that."""
    from tiny_llm.results.spectrum_table import collect_spectrum

    config, path = run
    H, _ = _dense_hessian(config, load_file(path / "run" / "epoch-000.safetensors"), epoch_plan(config, 1))
    exact = torch.linalg.eigvalsh(H)
    default = analyze_spectrum(
        path / "run", ["epoch-000.safetensors"], "seen", SETTINGS, SpectrumSettings(), path / "default.json"
    )
    assert all(p["converged"] for p in default["top_eigenvalues"] + default["top_magnitude_eigenvalues"])
    assert default["top_eigenvalues"][0]["eigenvalue"] == pytest.approx(float(exact[-1]), rel=1e-9)
    capped = SpectrumSettings(lanczos_steps=3, slq_vectors=1, slq_steps=3, cg_max_iterations=3)
    out = path / "spectra" / "k" / "seen.json"
    out.parent.mkdir(parents=True)
    with caplog.at_level("WARNING"):
        result = analyze_spectrum(path / "run", ["epoch-000.safetensors"], "seen", SETTINGS, capped, out)
    assert not result["lanczos"]["converged"] and not all(p["converged"] for p in result["top_eigenvalues"])
    assert "did not converge to 1e-06 in 3 Lanczos steps" in caplog.text
    states = {"states": [{"key": "k", "aliases": [{"file": "epoch-000.safetensors", "step": 0, "tokens": 0}]}]}
    result["state"]["key"] = "k"  # the index's key of this tree
    out.write_text(json.dumps(result))
    with caplog.at_level("WARNING"):
        rows = collect_spectrum(path, states, ["seen"])
    assert any(v is False for k, v in rows[0].items() if "_converged_" in k)
    assert "did not converge (epoch-000.safetensors seen)" in caplog.text


@pytest.mark.slow
def test_the_defaults_converge_at_the_demo_initial_state(tmp_path):
    """The demo model at its initialisation (where 20 fixed steps ended 5.9e-4 short): the default
    tolerance stops Lanczos converged, and the eigenvalue lies within its residual of a reference
    run three times as long (for a symmetric H an eigenvalue lies within ‖Hu − θu‖ of θ)."""
    from tiny_llm.config import load_config
    from tiny_llm.curvature.hessian import EpochHessian, Precision
    from tiny_llm.curvature.spectrum import top_eigenpairs
    from tiny_llm.data.corpus import Source, default_capacity, prepare_source_cache
    from tiny_llm.data.tokens import TokenCache
    from tiny_llm.model.llama import Llama

    config = load_config(Path(__file__).resolve().parents[3] / "config/runs/demo.yaml")
    cache = TokenCache(
        prepare_source_cache(config.data, Source("demo"), capacity=default_capacity(config), out=tmp_path / "c")
    )
    torch.manual_seed(config.training.seed)
    model = Llama(config.model, attention_backend="reference").double()
    rows = cache.tokens(epoch_plan(config, 1).blocks[:2].reshape(-1))  # 32 sequences of the seen epoch
    H = EpochHessian(
        model, rows, batch_size=16, engine="double_backward", precision=Precision(torch.device("cpu"), torch.float64)
    )
    defaults = SpectrumSettings()
    values, _, residuals, converged = top_eigenpairs(
        H.hvp, H.flat.D, defaults.top_k, defaults.lanczos_steps, tolerance=1e-6
    )
    steps = H.passes
    assert all(converged.tolist()) and steps < defaults.lanczos_steps
    reference, *_ = top_eigenpairs(H.hvp, H.flat.D, defaults.top_k, 3 * steps)
    assert abs(float(values[0]) - float(reference[0])) <= float(residuals[0])
    assert float(residuals[0]) <= 1e-6 * abs(float(values[0]))


def test_the_preconditioner_setting_enters_a_results_identity_only_when_it_is_not_the_default():
    """spectrum.preconditioner: applied (the default) leaves the identity as results before the
    setting had it, so they stay valid; next makes another result."""
    from dataclasses import asdict

    from tiny_llm.provenance import canonical_hash
    from tiny_llm.workers.settings import SpectrumSettings
    from tiny_llm.workers.spectrum import _identity

    analysis = {"settings": {"seed": 1}, "hash": "x"}
    before = {
        "settings": {"seed": 1},
        "spectrum": {k: v for k, v in asdict(SpectrumSettings()).items() if k != "preconditioner"},
    }
    assert _identity(analysis, SpectrumSettings())["hash"] == canonical_hash(before)
    following = _identity(analysis, SpectrumSettings(preconditioner="next"))
    assert following["spectrum"]["preconditioner"] == "next" and following["hash"] != canonical_hash(before)
