"""Summaries that a noisy machine cannot fake: median, interquartile range and a confidence interval.

Every benchmark figure is a median over repeated, interleaved measurements. The interquartile range
(IQR) says how much single measurements scatter; the 95 % confidence interval of the median (from
order statistics, no assumption about the distribution) says how well the median itself is known,
and narrows as repeats are added.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    median: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float
    n: int

    def as_dict(self, digits: int = 4) -> dict[str, float | int]:
        return {k: (v if isinstance(v, int) else round(v, digits)) for k, v in asdict(self).items()}

    def relative_ci(self) -> float:
        """Half-width of the confidence interval as a fraction of the median (0.02 = ±2 %)."""
        return (self.ci_high - self.ci_low) / 2 / abs(self.median) if self.median else math.inf


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the sorted sample that bracket the median with at least `confidence`.

    The number of values below the true median is Binomial(n, 1/2); the interval from the k-th smallest
    to the k-th largest value misses the median with probability 2 * P(Binomial <= k - 1).
    """
    if n < 6:  # fewer values cannot give 95 %: the whole range is the honest interval
        return 0, n - 1
    below, k = 0.0, 0
    while True:
        below += math.comb(n, k) / 2**n
        if 2 * below > 1 - confidence:
            return max(k - 1, 0), n - max(k, 1)
        k += 1


def summarize(values: list[float]) -> Summary:
    if not values:
        raise ValueError("summarize() needs at least one value")
    ordered = sorted(values)
    n = len(ordered)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if n > 1 else [ordered[0]] * 3
    lo, hi = median_ci_ranks(n)
    return Summary(statistics.median(ordered), quartiles[0], quartiles[2], ordered[lo], ordered[hi], n)


def describe(summary: Summary, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    """'1,234 µs (IQR 1,200-1,260, 95 % CI 1,220-1,250, n=30)'."""

    def fmt(value: float) -> str:
        return f"{value * scale:,.{digits}f}"

    unit = f" {unit}" if unit else ""
    return (
        f"{fmt(summary.median)}{unit} (IQR {fmt(summary.q1)}-{fmt(summary.q3)}, "
        f"95 % CI {fmt(summary.ci_low)}-{fmt(summary.ci_high)}, n={summary.n})"
    )
