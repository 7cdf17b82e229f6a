"""A mistyped name's nearest names: ``tpudash runz`` is told "did you mean 'run' or 'runs'?".

Typos are counted as letters wrong, missing, added, or two swapped
(Damerau-Levenshtein, restricted); the parser (``tpudash.cli.parser``) asks.
"""

from __future__ import annotations

from collections.abc import Iterable


def nearest_names(word: str, names: Iterable[str]) -> list[str]:
    """The names one typo away from ``word`` (two for a longer word), nearest first: ``runz`` → runs, run.

    A typo is a letter wrong, missing, added, or two swapped (``wtach``).
    Every name as near as the nearest is given: ``runz`` is as near ``run``
    as ``runs``, and a guess of one would be wrong half the time.
    """
    typed = word.casefold()
    allowed = 1 if len(typed) < 6 else 2
    distances = {name: typos_between(typed, name.casefold()) for name in names}
    nearest = min(distances.values(), default=allowed + 1)
    if nearest > allowed:
        return []
    return sorted(
        (name for name, distance in distances.items() if distance == nearest),
        key=lambda name: (abs(len(name) - len(typed)), name),
    )


def typos_between(first: str, second: str) -> int:
    """How many letters wrong, missing, added or swapped with their neighbour make ``first`` into ``second``."""
    previous: list[int] = []
    row = list(range(len(second) + 1))
    for i, letter in enumerate(first, 1):
        before, previous, row = previous, row, [i] + [0] * len(second)
        for j, other in enumerate(second, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (letter != other))
            if i > 1 and j > 1 and letter == second[j - 2] and first[i - 2] == other:
                row[j] = min(row[j], before[j - 2] + 1)
    return row[-1]
