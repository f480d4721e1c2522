"""Where a case's batches come from in the sources, and when that confounds what is measured.

The noise statistics treat the sequences of a batch as draws from one distribution (B_noise is a
critical batch size only then), and seen − unseen is a generalisation gap only when both cases are
drawn from the same text. A cache prepared in source order breaks both: a batch is one passage,
and the unseen case is whatever part of the sources training did not reach. ``order_report``
measures this for one case from the cache's block map; ``order_warnings`` turns the reports of an
analysis's cases into plain-language warnings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tiny_llm.data.tokens import BatchPlan, TokenCache

__all__ = ["CONTIGUOUS_FRACTION", "DISJOINT_DISTANCE", "HISTOGRAM_BINS", "order_report", "order_warnings"]

HISTOGRAM_BINS = 10
CONTIGUOUS_FRACTION = 0.5
"""A case's batches count as contiguous passages when their median span is below this fraction of
the span a random batch of the same size would have, ``(B - 1) / (B + 1)``."""
DISJOINT_DISTANCE = 0.5
"""Seen and unseen count as drawn from different parts of the sources when the total-variation
distance of their position histograms exceeds this."""


def order_report(cache: TokenCache, plan: BatchPlan) -> dict[str, Any]:
    """Where the blocks of ``plan`` lie in the sources the cache was prepared from.

    Positions are token offsets in the sources read one after another, divided by their total
    length (0 = the start of the first file, 1 = the end of the last). Returns:

    - ``shuffled``: whether preparation shuffled the sequences;
    - ``sources``: how many sources (files) the cache was prepared from;
    - ``batch_span``: median and smallest, over batches, of max − min position of a batch's
      sequences (a random batch of B spans (B − 1)/(B + 1) on average: ``random_batch_span``);
    - ``sources_per_batch``: mean and smallest number of sources a batch draws from;
    - ``position_range``: smallest and largest position of the case;
    - ``position_histogram``: the fraction of the case's sequences in each tenth of the sources;
    - ``source_fractions``: the fraction of the case's sequences from each source.
    """
    table, lengths = cache.block_sources()
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = table[plan.blocks]  # (batches, B, 2)
    position = (starts[rows[..., 0]] + rows[..., 1]) / max(int(starts[-1]), 1)
    span = position.max(axis=1) - position.min(axis=1)
    per_batch = np.array([len(np.unique(batch)) for batch in rows[..., 0]])
    B = plan.blocks.shape[1]
    histogram = np.histogram(position, bins=HISTOGRAM_BINS, range=(0.0, 1.0))[0] / position.size
    fractions = np.bincount(rows[..., 0].ravel(), minlength=len(lengths)) / position.size
    return {
        "shuffled": cache.shuffled,
        "sources": int(len(lengths)),
        "batch_span": {"median": float(np.median(span)), "min": float(span.min())},
        "random_batch_span": (B - 1) / (B + 1),
        "sources_per_batch": {"mean": float(per_batch.mean()), "min": int(per_batch.min())},
        "position_range": [float(position.min()), float(position.max())],
        "position_histogram": [round(float(x), 6) for x in histogram],
        "source_fractions": [round(float(x), 6) for x in fractions],
    }


def order_warnings(reports: dict[str, dict[str, Any]]) -> list[str]:
    """Plain-language warnings for an analysis's cases (``case -> order_report``); reports of
    results made before the report existed are skipped."""
    warnings = []
    for case, report in reports.items():
        if not report:
            continue
        random_span = report["random_batch_span"]
        if random_span > 0 and report["batch_span"]["median"] < CONTIGUOUS_FRACTION * random_span:
            warnings.append(
                f"{case}: batches are contiguous passages (median span {report['batch_span']['median']:.3f} "
                f"of the sources, a random batch spans {random_span:.3f}); B_noise and the other batch "
                "statistics mix a change of text with sampling noise. Prepare the cache shuffled "
                "(the default; cache_order: shuffle)"
            )
        missing = [i for i, f in enumerate(report["source_fractions"]) if f == 0]
        if missing and report["sources"] > 1:
            warnings.append(
                f"{case}: draws nothing from {len(missing)} of the {report['sources']} source files "
                f"(e.g. file {missing[0]})"
            )
    seen, unseen = reports.get("seen"), reports.get("unseen")
    if seen and unseen:
        distance = 0.5 * sum(
            abs(a - b) for a, b in zip(seen["position_histogram"], unseen["position_histogram"], strict=True)
        )
        if distance > DISJOINT_DISTANCE:
            warnings.append(
                f"seen and unseen come from different parts of the sources (seen spans "
                f"{seen['position_range'][0]:.2f}–{seen['position_range'][1]:.2f}, unseen "
                f"{unseen['position_range'][0]:.2f}–{unseen['position_range'][1]:.2f}; distance "
                f"{distance:.2f}); seen − unseen mixes a change of text with generalisation"
            )
    return warnings
