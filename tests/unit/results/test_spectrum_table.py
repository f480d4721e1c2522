"""spectrum.csv's row of a spectrum result: the preconditioned sharpness beside the step's learning
rate and Adam's threshold with their ratio, blank for a state without a preconditioner (the
collection of a whole analysis is tested with the spectrum worker: tests/unit/workers/test_spectrum.py)."""

import pytest

from tiny_llm.results.spectrum_table import _preconditioned_spectrum


def _result(preconditioner, preconditioned):
    pair = {"index": 0, "eigenvalue": 2.0, "residual": 1e-9, "converged": True}
    return {"top_eigenvalues": [pair], "preconditioner": preconditioner, "preconditioned": preconditioned}


def test_the_preconditioned_sharpness_beside_the_threshold_and_blank_without_one():
    record = {"optimizer": "adamw", "lr": 0.01, "stability_threshold": 3800.0}
    top = {"top_eigenvalues": [{"index": 0, "eigenvalue": 1900.0, "residual": 1e-6, "converged": True}]}
    row = _preconditioned_spectrum(_result(record, top))
    assert row == {
        "preconditioner": "adamw",
        "precond_la_eigenvalue_1": 1900.0,
        "precond_la_converged_1": True,
        "lr": 0.01,
        "stability_threshold": 3800.0,
        "precond_sharpness_over_threshold": pytest.approx(0.5),
    }
    blank = _preconditioned_spectrum(_result({"reason": "at step 0 Adam has no second moment yet"}, None))
    assert blank.keys() == row.keys() and set(blank.values()) == {""}  # the same columns, every cell blank
