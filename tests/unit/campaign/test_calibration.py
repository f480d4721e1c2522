"""The calibration job: a timing entry measured on this machine, inside the analysis's runtime
settings, and an out-of-memory refusal that names the settings to lower."""

import pytest
from builders import make_oracle_run

from tiny_llm.campaign.calibration import calibrate
from tiny_llm.workers.settings import AnalysisSettings


def test_calibrate_measures_this_machine(tmp_path):
    config = make_oracle_run(tmp_path)
    entry = calibrate(config, AnalysisSettings(device="cpu", dtype="float64", directions_per_pass=2), repeats=1)
    assert entry["key"]["device_kind"] == "cpu" and entry["key"]["hvp_batch_size"] == 2
    assert all(v > 0 for v in entry["seconds"].values())


def test_calibrate_measures_inside_the_analysis_runtime_settings(tmp_path, monkeypatch):
    """TF32 and the like are set as the analysis sets them, and recorded in the entry."""
    import contextlib

    import tiny_llm.campaign.calibration as calibration

    entered = []

    @contextlib.contextmanager
    def recording(device, tf32):
        entered.append((device.type, tf32))
        yield {"cuda_matmul_fp32_precision": "recorded"}

    monkeypatch.setattr(calibration, "runtime_settings", recording)
    entry = calibrate(
        make_oracle_run(tmp_path),
        AnalysisSettings(device="cpu", dtype="float64", tf32=False, directions_per_pass=2),
        repeats=1,
    )
    assert entered == [("cpu", False)]
    assert entry["measured"]["runtime"] == {"cuda_matmul_fp32_precision": "recorded"}


def test_calibrate_out_of_memory_names_the_settings_to_lower(tmp_path, monkeypatch):
    import torch

    from tiny_llm.curvature.hessian import EpochHessian

    def out_of_memory(self, V):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 34.00 GiB")

    monkeypatch.setattr(EpochHessian, "quadratic_forms", out_of_memory)
    settings = AnalysisSettings(device="cpu", dtype="float64", directions_per_pass=4, hvp_batch_size=2)
    with pytest.raises(
        ValueError,
        match=r"out of memory with --hvp-batch-size 2 and --directions-per-pass 4 .*"
        r"smaller memory_budget_gb .* \(e.g. 1 and 2\)",
    ):
        calibrate(make_oracle_run(tmp_path), settings, repeats=1)


def test_an_audited_setup_is_priced_with_its_audit(tmp_path):
    settings = AnalysisSettings(device="cpu", dtype="float32", directions_per_pass=2, audit_directions=1)
    entry = calibrate(make_oracle_run(tmp_path), settings, repeats=1)
    assert entry["seconds"]["audit_gradient_microbatch"] > 0 and entry["seconds"]["audit_microbatch_pass"] > 0
