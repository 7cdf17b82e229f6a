"""Per-batch values from Keras' running means.

Keras logs each metric as its mean over the epoch so far. A per-batch curve
wants the mean of just the batches since the last point: with running mean
m_n after n steps, the last k steps averaged (n·m_n − (n−k)·m_{n−k}) / k.
The train job and ``TpudashCallback`` both read Keras logs this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.events import is_finite_number


class BatchMeans:
    """Turns running epoch means into the mean of the batches since the previous call."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._steps = 0

    def reset(self) -> None:
        """A new epoch: Keras restarts its running means."""
        self._totals.clear()
        self._steps = 0

    @property
    def steps(self) -> int:
        """Steps of this epoch accounted for so far."""
        return self._steps

    def since_last(self, steps_done: int, running_means: Mapping[str, Any]) -> dict[str, float]:
        """The mean of each metric over the steps after the previous call, up to ``steps_done``.

        A value that is not a finite number (a NaN loss) comes back as NaN
        and poisons nothing after the epoch ends.
        """
        new_steps = steps_done - self._steps
        if new_steps <= 0:
            return {}
        values: dict[str, float] = {}
        for name, mean in running_means.items():
            if not is_finite_number(mean):
                values[name] = float("nan")
                self._totals.pop(name, None)
                continue
            total = float(mean) * steps_done
            previous = self._totals.get(name)
            values[name] = float(mean) if previous is None and self._steps else (total - (previous or 0.0)) / new_steps
            self._totals[name] = total
        self._steps = steps_done
        return values
