"""A result's reuse and its one writer, on one process: a finished result of the same identity,
state and case is reused; one of another is refused, as is a file that is no result; the writer
clears a killed write's leftovers and leaves no lock behind."""

import json

import pytest

from tiny_llm.workers.results import reusable_result


def _result(path, identity="h", key="k", case="seen"):
    path.write_text(json.dumps({"identity": {"hash": identity}, "state": {"key": key}, "case": case, "x": 1}))


def test_a_finished_result_is_reused_only_for_its_identity_state_and_case(tmp_path):
    output = tmp_path / "seen.json"
    assert reusable_result(output, {"hash": "h"}, "k", "seen") is None
    _result(output)
    assert reusable_result(output, {"hash": "h"}, "k", "seen")["x"] == 1
    for identity, key, case in (("other", "k", "seen"), ("h", "other", "seen"), ("h", "k", "unseen")):
        with pytest.raises(ValueError, match="holds a result with other settings, source or state"):
            reusable_result(output, {"hash": identity}, key, case)
    output.write_text("{not json")
    with pytest.raises(ValueError, match="exists but is not a tiny-llm result"):
        reusable_result(output, {"hash": "h"}, "k", "seen")
