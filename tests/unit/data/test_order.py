"""Data order: a shuffled cache makes every batch of seen and unseen span all of a corpus's
documents; a cache in source order is reported as contiguous and its cases as disjoint."""

import random

import numpy as np
import pytest

from tiny_llm.config import config_from_dict
from tiny_llm.data.corpus import Source, prepare_source_cache
from tiny_llm.data.order import order_report, order_warnings
from tiny_llm.data.tokens import TokenCache, epoch_plan, unseen_plan

ALPHABETS = ["abcdefgh ", "0123456789+", "XYZ!?;:-"]


def _documents(tmp_path):
    """Three documents of 12 KB whose symbol sets are disjoint: a sequence's document is readable
    from any of its bytes."""
    paths = []
    for i, alphabet in enumerate(ALPHABETS):
        rng = random.Random(i)
        path = tmp_path / f"doc-{i}.txt"
        path.write_text("".join(rng.choice(alphabet) for _ in range(12_000)))
        paths.append(path)
    return paths


def _config(tmp_path, cache):
    # 16 sequences of 32 per batch, 8 steps per epoch, 2 epochs: training reads 256 sequences and
    # the unseen epoch 128 more, of the ~1,125 the documents hold.
    return config_from_dict(
        {
            "model": {"vocab_size": 256, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 32},
            "data": {"cache": str(tmp_path / cache), "seq_len": 32, "shuffle_group_blocks": 32, "seed": 11},
            "training": {"batch_size": 16, "micro_batch_size": 8, "tokens": 2 * 8 * 16 * 32, "epochs": 2},
        }
    )


def _documents_per_batch(cache, plan):
    symbols = [set(a.encode()) for a in ALPHABETS]
    counts = []
    for blocks in plan.blocks:
        present = set(cache.tokens(blocks).numpy().ravel().tolist())
        counts.append(sum(bool(present & s) for s in symbols))
    return counts


@pytest.mark.parametrize("keep_order", [False, True])
def test_every_batch_of_seen_and_unseen_draws_from_every_document(tmp_path, keep_order):
    config = _config(tmp_path, "kept" if keep_order else "shuffled")
    cache = TokenCache(
        prepare_source_cache(config.data, Source("text", tuple(_documents(tmp_path))), keep_order=keep_order)
    )
    plans = {"seen": epoch_plan(config, 1), "unseen": unseen_plan(config)}
    reports = {case: order_report(cache, plan) for case, plan in plans.items()}
    warnings = order_warnings(reports)
    if keep_order:
        # In source order a batch is one passage of one document, and the unseen case is
        # whatever training did not reach: the report says both.
        counts = [n for plan in plans.values() for n in _documents_per_batch(cache, plan)]
        assert max(counts) <= 2 and counts.count(1) > 0.75 * len(counts)  # 2 only where a group crosses files
        assert reports["seen"]["batch_span"]["median"] < 0.05
        assert any("contiguous passages" in w for w in warnings)
        assert any("different parts of the sources" in w for w in warnings)
        return
    for case, plan in plans.items():
        assert _documents_per_batch(cache, plan) == [3] * len(plan), case
        report = reports[case]
        assert report["shuffled"] and report["sources"] == 3 and report["sources_per_batch"]["min"] == 3
        assert report["batch_span"]["median"] > 0.7 and report["random_batch_span"] == pytest.approx(15 / 17)
        assert all(0.2 < f < 0.47 for f in report["source_fractions"])
        assert sum(report["position_histogram"]) == pytest.approx(1, abs=1e-5)
    assert warnings == []


def test_reports_of_results_made_before_the_report_are_skipped():
    assert order_warnings({"seen": None, "unseen": None}) == []


def test_a_case_missing_a_source_file_is_named():
    report = {
        "random_batch_span": 0.8,
        "batch_span": {"median": 0.8, "min": 0.7},
        "sources": 3,
        "source_fractions": [0.5, 0.5, 0.0],
        "position_histogram": [0.1] * 10,
        "position_range": [0, 1],
    }
    assert order_warnings({"seen": report}) == ["seen: draws nothing from 1 of the 3 source files (e.g. file 2)"]
    assert np.isclose(sum(report["position_histogram"]), 1)
