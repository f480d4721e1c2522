"""The manifest's blocks: the precision audit's rows over the threshold, and the precision floor of
a float64 analysis whose model computes something below float64."""

from tiny_llm.results.manifest import audit_block, precision_floor


def test_the_audit_block_lists_the_rows_over_the_threshold_with_their_statistics():
    rows = [
        {"file": "a", "case": "seen", "state_key": "k", "audit_statistic_error": 0.03, "audit_max_relative_error": 0.1},
        {
            "file": "b",
            "case": "seen",
            "state_key": "l",
            "audit_statistic_error": 0.001,
            "audit_max_relative_error": 0.2,
        },
        {"file": "c", "case": "seen", "state_key": "m", "audit_statistic_error": "", "audit_max_relative_error": ""},
    ]
    errors = {"b_noise": 0.03, "b_simple": 0.002, "grad_curvature": None}
    results = {(r["state_key"], "seen"): {"audit": {"statistics_relative_error": errors}} for r in rows}
    block = audit_block(rows, results, "mine", 0.01)
    assert block["audited_rows"] == 2 and block["max_statistic_error"] == 0.03 and block["max_relative_error"] == 0.2
    assert block["exceeded"] == [{"file": "a", "case": "seen", "relative_error": 0.03, "statistics": ["b_noise"]}]


def test_the_precision_floor_gathers_what_stayed_below_float64():
    def result(below, rounding):
        return {"precision": {"below_float64": below, "gradient_rounding": rounding}}

    assert precision_floor({("k", "seen"): result([], None)}) is None  # float64 throughout
    floor = precision_floor(
        {
            ("k", "seen"): result(["half"], 2e-7),
            ("l", "seen"): result(["half", "to"], 5e-7),
            ("m", "seen"): result([], None),
        }
    )
    assert floor == {"operations": ["half", "to"], "gradient_rounding": 5e-7, "results": 2}
