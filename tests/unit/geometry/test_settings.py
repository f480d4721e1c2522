"""A cross-seed experiment's settings: loaded by the one typed loader (unknown keys, types, ranges),
with the cross-field check by hand, and what a measurement costs in a timing entry's units."""

from dataclasses import replace

import pytest

from tiny_llm.config import RunConfig
from tiny_llm.geometry.settings import GeometrySettings, geometry_settings_from_dict, measurement_work


def test_settings_are_checked():
    with pytest.raises(ValueError, match="unknown key rows; allowed keys: reference_rows"):
        geometry_settings_from_dict({"rows": 3})
    with pytest.raises(ValueError, match="top_k .3. must not exceed cov_num_batches .2."):
        GeometrySettings(top_k=3, cov_num_batches=2)
    with pytest.raises(ValueError, match="cov_num_batches: expected an integer >= 2, got 1"):
        GeometrySettings(cov_num_batches=1, top_k=1)
    with pytest.raises(ValueError, match="hessian_eig_every: expected a non-negative integer, got -1"):
        geometry_settings_from_dict({"hessian_eig_every": -1})


def test_the_work_of_a_measurement_counts_every_pass():
    """4 reference rows in micro-batches of 2, 2 covariance batches of 2, 3 probes, 5 Lanczos steps."""
    config = RunConfig(training=replace(RunConfig().training, micro_batch_size=2, batch_size=2))
    settings = GeometrySettings(
        reference_rows=4,
        cov_num_batches=2,
        cov_batch_size=2,
        top_k=1,
        hutchinson_samples=3,
        lanczos_steps=5,
        hvp_batch_size=4,
    )
    work = measurement_work(config, settings)
    # gradient: reference 2 + covariance 2·1 + 2·reference 4 + reference 2 + 3 probes · 2
    assert work == {"gradient_microbatches": 2 + 2 + 4 + 2 + 6, "hvp_microbatch_passes": (1 + 5) * 1}
