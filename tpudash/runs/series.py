"""Bounded metric histories and smoothing, without Textual.

A run can report millions of points; ``DecimatedSeries`` keeps a bounded,
evenly spread subset, so the run model (``tpudash.runs.model``), the plots and
the history benchmark all hold the same small amount whatever the run's length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from jobs.events import is_finite_number

DEFAULT_SERIES_CAPACITY = 2048
SMOOTHING_WEIGHT = 0.6


class DecimatedSeries:
    """An (x, y) history of bounded size.

    Every ``stride``-th point is kept; when ``capacity`` points are stored,
    every other one is dropped and the stride doubles, so the kept points stay
    evenly spread over the whole run and memory never grows past ``capacity``.
    The latest point is always drawn, stored or not. Points whose y is NaN or
    infinite are counted (``nonfinite``) but not stored: plots cannot draw them.
    """

    __slots__ = ("capacity", "_xs", "_ys", "_stride", "_seen", "last", "nonfinite")

    def __init__(self, capacity: int = DEFAULT_SERIES_CAPACITY):
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.capacity = capacity
        self._xs: list[float] = []
        self._ys: list[float] = []
        self._stride = 1
        self._seen = 0
        self.last: tuple[float, float] | None = None
        self.nonfinite = 0

    def append(self, x: float, y: float) -> None:
        if not is_finite_number(y):
            self.nonfinite += 1
            return
        self.last = (x, y)
        if self._seen % self._stride == 0:
            self._xs.append(x)
            self._ys.append(y)
            if len(self._xs) >= self.capacity:
                del self._xs[1::2]
                del self._ys[1::2]
                self._stride *= 2
        self._seen += 1

    def extend(self, points: Iterable[tuple[float, float]]) -> None:
        for x, y in points:
            self.append(x, y)

    @property
    def seen(self) -> int:
        """How many finite points were appended in total."""
        return self._seen

    @property
    def stride(self) -> int:
        return self._stride

    def __len__(self) -> int:
        return len(self._xs)

    def points(self) -> tuple[list[float], list[float]]:
        """The kept points plus the latest one, oldest first."""
        xs, ys = list(self._xs), list(self._ys)
        if self.last is not None and (not xs or xs[-1] != self.last[0] or ys[-1] != self.last[1]):
            xs.append(self.last[0])
            ys.append(self.last[1])
        return xs, ys


def decimate_min_max(xs: Sequence[float], ys: Sequence[float], buckets: int) -> tuple[list[float], list[float]]:
    """At most ``2 * buckets`` points that keep every bucket's lowest and highest y.

    Stride sampling would hide a loss spike between samples; min/max keeps it.
    """
    count = len(xs)
    if buckets <= 0 or count <= 2 * buckets:
        return list(xs), list(ys)
    out_x: list[float] = []
    out_y: list[float] = []
    size = count / buckets
    for bucket in range(buckets):
        start = int(bucket * size)
        end = max(start + 1, int((bucket + 1) * size))
        segment = ys[start:end]
        low = min(range(len(segment)), key=segment.__getitem__)
        high = max(range(len(segment)), key=segment.__getitem__)
        for index in sorted({low, high}):
            out_x.append(xs[start + index])
            out_y.append(segment[index])
    if out_x[-1] != xs[-1]:
        out_x.append(xs[-1])
        out_y.append(ys[-1])
    return out_x, out_y


def decimate_stride(xs: Sequence[float], ys: Sequence[float], limit: int) -> tuple[list[float], list[float]]:
    """At most about ``limit`` evenly spaced points, always ending on the last one."""
    count = len(xs)
    if limit <= 0 or count <= limit:
        return list(xs), list(ys)
    step = count / limit
    indices = sorted({int(position * step) for position in range(limit)} | {count - 1})
    return [xs[index] for index in indices], [ys[index] for index in indices]


class Ema:
    """TensorBoard-style debiased exponential moving average, for per-batch noise."""

    __slots__ = ("weight", "_value", "_count")

    def __init__(self, weight: float = SMOOTHING_WEIGHT):
        self.weight = weight
        self._value = 0.0
        self._count = 0

    def update(self, value: float) -> float:
        if not math.isfinite(value):
            return value
        self._count += 1
        self._value = self._value * self.weight + (1.0 - self.weight) * value
        debias = 1.0 - self.weight**self._count
        return self._value / debias if debias > 0 else value
