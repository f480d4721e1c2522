"""An analysis's settings: the audit's default, and the command line's words in a configuration."""

import pytest

from tiny_llm.workers.settings import AnalysisSettings


def test_the_audit_is_on_by_default_unless_float64():
    assert AnalysisSettings(dtype="float32").audited and AnalysisSettings(dtype="float32", amp=True).audited
    assert not AnalysisSettings(dtype="float64").audited
    assert AnalysisSettings(dtype="float64", audit=True).audited and not AnalysisSettings(audit=False).audited
    # the command line's on/off are accepted in a configuration too, as true/false
    assert AnalysisSettings(audit="on") == AnalysisSettings(audit=True)
    assert AnalysisSettings(audit="off") == AnalysisSettings(audit=False)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="audit: expected true or false or one of 'auto'"):
            AnalysisSettings(audit=bad)
    with pytest.raises(ValueError, match="audit_batches: expected a positive integer"):
        AnalysisSettings(audit_batches=0)
