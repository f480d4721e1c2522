"""The measurement records: what a job measures, saved as a result's JSON and read back unchanged."""

import math

import pytest

from tiny_llm.curvature.records import ConsensusWorker, NoiseSample, RandomDirection, consensus_block


def test_records_round_trip_through_a_results_json():
    noise = NoiseSample(
        curvature=2.5,
        gauss_newton=1.5,
        squared_norm=4.0,
        batch_index=3,
        stream_batch=7,
        grad_norm=1.25,
        loss=0.5,
        block_grad_squared_norms=[1.0, 0.5],
        block_noise_squared_norms=[3.0, 1.0],
    )
    saved = noise.to_json()
    assert saved["noise_norm"] == 2.0 and saved["noise_gauss_newton"] == 1.5 and "worker" not in saved
    assert NoiseSample.from_json(saved) == noise
    random = RandomDirection(curvature=-1.0, gauss_newton=0.5, hvp_seconds=0.25, index=2)  # its norm² is D, not saved
    assert RandomDirection.from_json(random.to_json()) == random


def test_the_consensus_block_aggregates_the_workers_errors():
    workers = [
        ConsensusWorker(curvature=2.0, squared_norm=4.0, worker=0),
        ConsensusWorker(curvature=1.0, squared_norm=1.0, worker=1),
    ]
    block = consensus_block(workers)
    assert block["aggregate"]["mean_curvature"] == pytest.approx(1.5)
    assert block["aggregate"]["normalized_alignment"] == pytest.approx(3.0 / 5.0)
    assert block["aggregate"]["mean_norm"] == pytest.approx((2.0 + 1.0) / 2)
    assert [w["norm"] for w in block["workers"]] == [2.0, math.sqrt(1.0)]
