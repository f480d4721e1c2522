"""The critical-batch page's tables: written from cbs.csv's and rates.csv's rows as the files hold
them, placed between the page's markers, and refused for an experiment the page has no block for."""

import pytest

from tiny_llm.results.cbs_page import experiment_tables, replace_tables, table_blocks

ROW = {
    "checkpoint": "epoch-002", "tokens": "81920", "rates": "tuned", "lr_edge": "16", "cbs": "4", "cbs_low": "4",
    "cbs_high": "", "b_crit": "12.5", "b_crit_low": "3.25", "b_crit_high": "inf", "b_crit_censored": "16",
    "b_crit_violations": "2>4", "paired_spread": "0.0042", "seeds": "5", "seeds_needed": "9",
    "agreeing_scale_low": "1.4", "agreeing_scale_high": "inf", "b_simple": "4.78", "b_simple_se": "0.41",
    "b_simple_cbs": "5.1", "b_simple_cbs_low": "4.6", "b_simple_cbs_high": "5.5", "b_simple_cbs_agrees": "True",
    "b_noise": "", "b_noise_se": "", "b_noise_cbs": "", "b_noise_cbs_low": "", "b_noise_cbs_high": "",
    "b_noise_cbs_agrees": "", "precond_b_noise": "0.5", "precond_b_noise_se": "0.1", "precond_b_noise_cbs": "2.5",
    "precond_b_noise_cbs_low": "", "precond_b_noise_cbs_high": "", "precond_b_noise_cbs_agrees": "False",
}  # fmt: skip
RATES = [
    {"checkpoint": "epoch-002", "batch_size": b, "lr_factor": f, "best": str(best), "lr_edge": str(edge)}
    for b, f, best, edge in (("2", "0.5", False, False), ("2", "1.0", True, False), ("16", "1.0", False, False),
                             ("16", "2.0", True, True), ("2", "2.0", False, False), ("16", "0.5", False, False))
]  # fmt: skip


def test_the_tables_say_what_the_row_says():
    text = experiment_tables([ROW], RATES)
    assert "| epoch 2 (81,920) | tuned (edge: 16) | 4 | [4, ∞) | 12.5 | [3.25, ∞] | 16 | 2>4 | 0.0042 | 5 (9) |" in text
    assert "| [1.4, ∞) | 4.78 ± 0.41 → 5.1 [4.6, 5.5] ✓ | – | 0.5 ± 0.1 → 2.5 ✗ |" in text
    assert "| epoch 2 | 1 | 2\\* |" in text  # batch 2's best rate is the rule's; batch 16's at the grid's edge
    none = experiment_tables([{**ROW, "agreeing_scale_low": "0.0", "agreeing_scale_high": "0.0"}], RATES)
    assert "| tuned | none | 4.78" in none  # no noise scale predicts a B* inside the interval
    untuned = experiment_tables([{**ROW, "rates": "rule", "lr_edge": ""}], [{**r, "lr_factor": "1.0"} for r in RATES])
    assert "B = 16" not in untuned and "| rule |" in untuned


def test_a_block_is_replaced_in_place_and_only_its_own():
    page = "intro\n<!-- BEGIN tables of a -->\nold a\n<!-- END tables of a -->\nmid\n"
    page += "<!-- BEGIN tables of b -->\nold b\n<!-- END tables of b -->\nend\n"
    new = replace_tables(page, "a", "new a\n")
    assert table_blocks(new) == {"a": "new a\n", "b": "old b\n"}
    assert new.startswith("intro\n") and new.endswith("end\n") and "\nmid\n" in new
    with pytest.raises(ValueError, match="no <!-- BEGIN tables of c --> block"):
        replace_tables(page, "c", "x")
