"""A study across seeds, planned: its analyses checked, and weights shared across seeds reported."""

from types import SimpleNamespace

import pytest

from tiny_llm.campaign.studies import plan_seed_studies


def test_a_study_is_checked_and_weights_shared_across_seeds_are_reported():
    runs = SimpleNamespace(
        digests={"a": [("step0", "d0"), ("step1", "d1")], "b": [("step0", "d0"), ("step1", "e1")]}, notes=[]
    )
    analyses = {"a": {}, "b": {}, "c": {}}
    plans = plan_seed_studies({"st": {"analyses": ["a", "b"]}}, analyses, runs)
    assert plans["st"].shared == ("a step0, b step0 are the same weights",)
    assert runs.notes == ["seed_studies.st: a step0, b step0 are the same weights"]
    assert plans["st"].summaries() == {"a": "results/a/summary.csv", "b": "results/b/summary.csv"}
    for entry, message in (
        ({"analyses": ["a"]}, r"seed_studies.st.analyses: list two or more analyses"),
        ({"analyses": ["a", "a"]}, r"seed_studies.st.analyses: list two or more analyses, one per seed, each once"),
        ({"analyses": ["a", "z"]}, r"seed_studies.st.analyses: z not among the analyses"),
    ):
        with pytest.raises(ValueError, match=message):
            plan_seed_studies({"st": entry}, analyses, runs)
    with pytest.raises(ValueError, match=r"seed_studies.a: results/a is analysis a's"):
        plan_seed_studies({"a": {"analyses": ["b", "c"]}}, analyses, runs)
