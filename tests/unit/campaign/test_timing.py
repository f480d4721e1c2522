"""Walltime: measured timings scaled to the actual work; 2 x work + 30 min, whole hours, <= 72 h."""

import dataclasses
import math

import pytest
from builders import make_oracle_run

from tiny_llm.campaign.plan import estimate_seconds, job_minutes
from tiny_llm.campaign.timing import load_profiles, lookup, timing_key, write_profile
from tiny_llm.workers.settings import AnalysisSettings

SECONDS = {"startup": 100.0, "gradient_microbatch": 1.0, "hvp_microbatch_pass": 10.0}
PLAIN = AnalysisSettings(
    noise_samples=4,
    random_samples=7,
    directions_per_pass=4,
    hvp_batch_size=5,
    dtype="float64",
    trajectory=False,
    preconditioned=False,
)
"""The timing tests' settings: S_v = 4, S_r = 7, K = 4 on curvature micro-batches of 5, the plain
geometry only, no successor."""


def test_estimate_scales_with_epoch_and_samples(tmp_path):
    config = make_oracle_run(tmp_path, tokens=3 * 6 * 5 * 2)  # 5 batches of B=3, micro-batch 2
    settings = PLAIN
    # gradients: (5 epoch batches + 4 samples) x 2 micro-batches; HVP: ceil(12 / 4) passes x ceil(15 / 5) batches
    assert estimate_seconds(config, settings, SECONDS) == 100 + 9 * 2 * 1.0 + 3 * 3 * 10.0
    # in the optimizer's geometry too (auto: priced wherever it may be measured), the 12 forms again: 6 passes
    both = dataclasses.replace(settings, preconditioned="auto")
    assert estimate_seconds(config, both, SECONDS) == 100 + 9 * 2 * 1.0 + 6 * 3 * 10.0
    # with a successor: the step Δ is a 13th form (a 4th pass), and the loss at θ + Δ 5 x 2 forward micro-batches
    stepped = dataclasses.replace(settings, trajectory=True)
    assert estimate_seconds(config, stepped, SECONDS) == 100 + 9 * 2 * 1.0 + 4 * 3 * 10.0 + 5 * 2 * 1.0
    assert estimate_seconds(config, stepped, {**SECONDS, "forward_microbatch": 0.25}) == 100 + 18 + 120 + 10 * 0.25
    more = dataclasses.replace(settings, noise_samples=None)
    assert estimate_seconds(config, more, SECONDS, workers=4) == 100 + 10 * 2 + math.ceil(17 / 4) * 3 * 10


def test_estimate_counts_the_process_start_and_the_audit(tmp_path):
    config = make_oracle_run(tmp_path, tokens=3 * 6 * 5 * 2)
    audited = dataclasses.replace(PLAIN, dtype="float32", audit_directions=2, audit_batches=2)
    seconds = {**SECONDS, "process": 5.0, "audit_gradient_microbatch": 3.0, "audit_microbatch_pass": 20.0}
    # The audit: float64 ḡ over 5 batches and 2 audited gᵢ (x 2 micro-batches each), then the forms of its
    # directions on 2 curvature micro-batches in both precisions.
    audit = (5 + 2) * 2 * 3.0 + 2 * (10.0 + 20.0)
    assert estimate_seconds(config, audited, seconds) == 5 + 100 + 9 * 2 * 1.0 + 3 * 3 * 10.0 + audit


def test_walltime_rounding_and_limit():
    assert job_minutes(0) == 60 and job_minutes(900) == 60 and job_minutes(901) == 120
    assert job_minutes(3600 * 35) == 71 * 60
    with pytest.raises(ValueError, match="exceeds the partition limit of 72 h"):
        job_minutes(3600 * 36)


def test_lookup_matches_the_setup_and_gpu_kind(tmp_path):
    config = make_oracle_run(tmp_path)
    settings = AnalysisSettings(device="cpu")
    key = timing_key(config, settings, "cuda:NVIDIA GH200 480GB")
    write_profile(tmp_path / "timing" / "a.json", {"key": key, "seconds": SECONDS})
    entries = load_profiles([tmp_path / "timing", tmp_path / "missing.yaml"])
    assert lookup(entries, {**key, "device_kind": ""}, "GH200") == SECONDS
    assert lookup(entries, {**key, "device_kind": ""}, "H100") is None
    assert lookup(entries, {**key, "directions_per_pass": 4}) is None
