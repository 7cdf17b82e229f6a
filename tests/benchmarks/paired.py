"""Paired ratios and their spread: the median of per-round ratios, its bootstrap 95 % interval and the IQR.

Each round measures every side once, back to back, so load from other
processes (which drifts over minutes on a shared machine) hits a round's
sides alike; the ratio of two sides is taken within each round, and the
rounds' ratios summarised. The interval is a percentile bootstrap of the
median (resampling rounds, a fixed seed so a report can be reproduced from
its samples).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

BOOTSTRAP_RESAMPLES = 4000


@dataclass(frozen=True)
class Spread:
    """The median of paired ratios with its 95 % bootstrap interval and interquartile range."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    rounds: int

    def text(self) -> str:
        """``0.984 [0.962, 1.003] (IQR 0.970–0.995, 12 rounds)``."""
        return (
            f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}] "
            f"(IQR {self.q1:.3f}–{self.q3:.3f}, {self.rounds} rounds)"
        )


def quantile(values: list[float], fraction: float) -> float:
    """Linear-interpolation quantile of ``values`` (any order)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def spread(ratios: list[float], seed: int = 0) -> Spread:
    """The median of ``ratios``, a 95 % percentile-bootstrap interval of it, and its IQR."""
    if not ratios:
        nan = float("nan")
        return Spread(nan, nan, nan, nan, nan, 0)
    chooser = random.Random(seed)
    medians = sorted(statistics.median(chooser.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_RESAMPLES))
    return Spread(
        median=statistics.median(ratios),
        low=quantile(medians, 0.025),
        high=quantile(medians, 0.975),
        q1=quantile(ratios, 0.25),
        q3=quantile(ratios, 0.75),
        rounds=len(ratios),
    )


def paired_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Round by round ``numerator / denominator``; a round missing either side is left out."""
    return [top / bottom for top, bottom in zip(numerators, denominators) if top == top and bottom == bottom and bottom]
