"""The campaign record is appended to, never rewritten from scratch, and refuses a foreign file."""

import json

import pytest

from tiny_llm.results.record import append_event, job_records


def test_events_are_appended_in_order(tmp_path):
    append_event(tmp_path / "a", {"event": "start", "source": "s1"})
    record = append_event(tmp_path / "a", {"event": "collected", "jobs": []})
    assert [e["event"] for e in record["events"]] == ["start", "collected"]
    assert json.loads((tmp_path / "a/campaign.json").read_text()) == record
    assert all("at" in e for e in record["events"])


def test_a_foreign_file_is_refused_untouched(tmp_path):
    (tmp_path / "campaign.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a campaign record; move it away"):
        append_event(tmp_path, {"event": "start"})
    assert (tmp_path / "campaign.json").read_text() == "[1, 2]"


def test_job_records_say_where_each_result_was_computed():
    requested = {"runtime": 120, "cpus_per_task": 72, "mem_mb": 110000, "gpu": 1, "gpu_model": "gh200", "threads": 72}
    slurm = {"job_id": "42", "node": "n1", "partition": "gpu", "attempt": 2, "restarts": 0, "requested": requested}
    results = {
        ("k1", "seen"): {"slurm": slurm, "timing": {"wall_seconds": 3.5}},
        ("k1", "unseen"): {"slurm": None, "timing": {"wall_seconds": 1.0}},
    }
    jobs = job_records("a", results)
    assert jobs[0] == {
        "state": "k1",
        "case": "seen",
        "slurm_job_id": "42",
        "node": "n1",
        "partition": "gpu",
        "attempt": 2,
        "restarts": 0,
        "requested": requested,
        "wall_seconds": 3.5,
        "log": "logs/analyze_state/a/k1/seen.log",
    }
    assert jobs[1]["slurm_job_id"] is None and jobs[1]["wall_seconds"] == 1.0
