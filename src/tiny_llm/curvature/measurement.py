"""What one (state, case) job computes, torch-free: the one description that the worker runs
(:func:`tiny_llm.curvature.noise.measure_case` counts its directions from it) and the planner
prices (:func:`tiny_llm.campaign.plan.case_work`), so that the printed price and the work cannot
drift apart.

A job measures, over one epoch of ``n_batches`` effective batches:

* ḡ and the epoch loss (a gradient pass over every batch), and S_v sampled batch gradients gᵢ;
* the quadratic forms of S_v noise directions vᵢ = gᵢ − ḡ, of ḡ, of S_r Rademacher directions,
  of a packed run's consensus errors (one per worker), and with a successor (the trajectory) of the
  step Δ; with ``block_curvature`` each noise direction, ḡ and Δ once more per parameter block;
* with the optimizer's preconditioner P, the noise, ḡ and Rademacher forms (and their blocks) once
  more, in the coordinates u = P^{-1/2}θ (:mod:`tiny_llm.curvature.noise`);
* with a successor the epoch loss at θ + Δ (a forward pass over every batch), and per block at
  θ + Δ_b;
* with the precision audit, ḡ again in float64, the audited batch gradients in both precisions,
  and the forms of the audited directions (a noise, a random and ḡ, in each geometry) on a seeded
  sample of curvature micro-batches, once in each precision.

The worker records the plan's counts in its result (``measurement_plan``) beside what it counted (``counts``);
the planner's price reads the same counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DirectionGroup", "MeasurementPlan"]


@dataclass(frozen=True)
class DirectionGroup:
    """Directions of one kind in one geometry: ``count`` of them, each measured whole or, with
    ``per_block``, once per parameter block (its block-diagonal forms). Kinds: ``noise`` (vᵢ =
    gᵢ − ḡ), ``gradient`` (ḡ), ``random`` (Rademacher), ``consensus`` (a packed run's workers),
    ``step`` (Δ to a successor); geometries ``plain`` and ``preconditioned`` (u = P^{-1/2}θ)."""

    kind: str
    geometry: str
    count: int
    per_block: bool = False

    def forms(self, blocks: int) -> int:
        """Quadratic forms of the group, with ``blocks`` parameter blocks."""
        return self.count * (blocks if self.per_block else 1)

    def record(self) -> dict[str, object]:
        return {"kind": self.kind, "geometry": self.geometry, "count": self.count, "per_block": self.per_block}


GEOMETRIES = ("plain", "preconditioned")


@dataclass(frozen=True)
class MeasurementPlan:
    """The counts of one (state, case) job (module docstring)."""

    n_batches: int
    """Effective batches of the epoch."""
    noise_samples: int
    """S_v, the sampled batches (at most ``n_batches``)."""
    random_samples: int
    """S_r, the Rademacher directions."""
    consensus: int = 0
    """A packed run's consensus directions (one per worker; none unpacked)."""
    blocks: int = 0
    """Parameter blocks whose block-diagonal forms are measured (0: none)."""
    step: bool = False
    """Whether the step Δ to a successor is measured (its form, and the loss at θ + Δ)."""
    geometries: int = 1
    """The coordinates the statistics are taken in: 1 (plain), or 2 (also the optimizer's
    preconditioned ones: the noise, ḡ and random directions once more, with their blocks)."""
    hvp_batches: int = 0
    """Curvature micro-batches of the epoch (each pass is over all of them)."""
    audit: int = 0
    """a, the precision audit's directions of each kind asked for (0: no audit)."""
    audit_batches: int = 0
    """Curvature micro-batches the audit asks to measure."""

    @classmethod
    def of(
        cls, n_batches: int, noise_samples: int | None, random_samples: int, **counts: int | bool
    ) -> MeasurementPlan:
        """The plan of an epoch of ``n_batches`` with ``noise_samples`` asked for (None: every batch;
        capped by the epoch); ``counts``: ``consensus``, ``blocks``, ``step``, ``geometries``,
        ``hvp_batches``, ``audit``, ``audit_batches``."""
        drawn = n_batches if noise_samples is None else min(noise_samples, n_batches)
        return cls(n_batches, drawn, random_samples, **counts)

    def groups(self) -> tuple[DirectionGroup, ...]:
        """The job's directions by kind, geometry and block: the noise directions, ḡ and the random
        ones in each geometry (the first two once more per block), the consensus directions, and Δ
        (per block too)."""
        groups = []
        for geometry in GEOMETRIES[: self.geometries]:
            for kind, count in (("noise", self.noise_samples), ("gradient", 1)):
                groups.append(DirectionGroup(kind, geometry, count))
                groups += [DirectionGroup(kind, geometry, count, per_block=True)] if self.blocks else []
            groups.append(DirectionGroup("random", geometry, self.random_samples))
        groups += [DirectionGroup("consensus", "plain", self.consensus)] if self.consensus else []
        if self.step:
            groups.append(DirectionGroup("step", "plain", 1))
            groups += [DirectionGroup("step", "plain", 1, per_block=True)] if self.blocks else []
        return tuple(groups)

    def audit_groups(self) -> tuple[DirectionGroup, ...]:
        """The precision audit's directions: a seeded subset of the noise and random groups and ḡ,
        in every geometry (none without an audit)."""
        if not self.audit:
            return ()
        counts = (("noise", self.audit_noise), ("random", self.audit_random), ("gradient", 1))
        return tuple(DirectionGroup(k, g, n) for g in GEOMETRIES[: self.geometries] for k, n in counts)

    @property
    def directions(self) -> int:
        """Quadratic forms: every group's (``groups``)."""
        return sum(group.forms(self.blocks) for group in self.groups())

    def passes(self, directions_per_pass: int) -> int:
        """Passes over the epoch's curvature micro-batches, K directions at a time."""
        return math.ceil(self.directions / directions_per_pass)

    @property
    def gradient_batches(self) -> int:
        """Batch gradients: every batch for ḡ, and each sampled one."""
        return self.n_batches + self.noise_samples

    @property
    def audit_noise(self) -> int:
        """Noise batches the audit rebuilds in both precisions (at most S_v)."""
        return min(self.audit, self.noise_samples)

    @property
    def audit_random(self) -> int:
        """Rademacher directions the audit measures (at most S_r)."""
        return min(self.audit, self.random_samples)

    @property
    def audit_directions(self) -> int:
        """The audit's quadratic forms in each precision: its noise and random directions and ḡ, in
        each geometry, in one pass (``audit_groups``)."""
        return sum(group.count for group in self.audit_groups())

    @property
    def audit_micro_batches(self) -> int:
        """Curvature micro-batches the audit measures (at most the epoch's)."""
        return min(self.audit_batches, self.hvp_batches) if self.audit else 0

    @property
    def audit_gradient_batches(self) -> int:
        """Batch gradients the audit computes in float64: every batch for ḡ, and each audited one."""
        return self.n_batches + self.audit_noise if self.audit else 0

    def record(self, directions_per_pass: int) -> dict[str, int]:
        """The counts a result records, K directions per pass (what the price reads)."""
        return {
            "gradient_batches": self.gradient_batches,
            "forward_batches": self.forward_batches,
            "directions": self.directions,
            "passes": self.passes(directions_per_pass),
            "hvp_batches": self.hvp_batches,
            "audit_gradient_batches": self.audit_gradient_batches,
            "audit_directions": self.audit_directions,
            "audit_micro_batches": self.audit_micro_batches,
            "groups": [group.record() for group in self.groups()],
            "audit_groups": [group.record() for group in self.audit_groups()],
        }

    @property
    def forward_batches(self) -> int:
        """Batches of forward passes only: the epoch at θ + Δ (with a successor)."""
        return self.n_batches if self.step else 0
