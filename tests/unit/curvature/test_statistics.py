"""The statistics are declared once: the result blocks, summary.csv, the audit and the reading
guide all follow the declaration."""

import re
from pathlib import Path

from tiny_llm.curvature.statistics import STANDARD_ERRORS, STATISTICS, AuditPairs, implied_errors
from tiny_llm.results.collect import ERROR_COLUMNS, GAUSS_NEWTON, SUMMARY_COLUMNS

GUIDE = (Path(__file__).resolve().parents[3] / "docs/reading-results.md").read_text()


def test_summary_columns_and_standard_errors_follow_the_declaration():
    names = [s.name for s in STATISTICS]
    assert SUMMARY_COLUMNS[SUMMARY_COLUMNS.index("loss") :][: len(names)] == names
    assert STANDARD_ERRORS == [s.name for s in STATISTICS if s.sampled]
    assert ERROR_COLUMNS == [f"{name}_se" for name in STANDARD_ERRORS]
    assert GAUSS_NEWTON == [s.name for s in STATISTICS if s.part_of]
    for part in STATISTICS:
        assert part.part_of is None or part.part_of in names  # a part names a statistic that exists


def test_every_audited_statistic_has_an_implied_error():
    pairs = AuditPairs(
        noise=(2.0, 2.0),
        gradient=(1.0, 1.0),
        random=(3.0, 3.0),
        norms2=(4.0, 4.0),
        roots=(2.0, 2.0),
        grads=(5.0, 5.0),
        grad_norms=(1.0, 1.0),
        losses=(3.0, 3.0),
    )
    errors = implied_errors(pairs)
    exact = [s.name for s in STATISTICS if s.audited and not s.sampled]
    assert list(errors) == exact + [s.name for s in STATISTICS if s.audited and s.sampled]
    assert all(value == 0.0 for value in errors.values())  # equal pairs imply no error
    # every statistic measured on directions whose precision can differ is audited
    assert {s.name for s in STATISTICS if not s.audited} == set(GAUSS_NEWTON)


def test_the_reading_guide_documents_every_statistic_in_a_table():
    documented = set(re.findall(r"^\| `(\w+)` \|", GUIDE, re.M))
    assert {s.name for s in STATISTICS} <= documented
    for name in STANDARD_ERRORS:
        assert name in GUIDE
