"""Target: the pipeline advice costs a few milliseconds at a run's start, whatever the data size (issue 40, item 3).

``tpudash.advice.pipeline.advise_pipeline`` walks the dataset's Python
objects. Measured side by side in one process, alternated A B A B, medians:

- **the walk on MNIST-size data**: the pitfalls pipeline (map, a py_function
  map, repeat, shuffle, batch) over ``from_tensor_slices`` of 60,000 28×28
  float32 images and their int64 labels (189 MB held by the source);
- **the walk on 600 examples**: the same pipeline over 600 of them. The ratio
  of the two says whether the cost grows with the data (it must not: ≤ 2×);
- **serialising the MNIST-size dataset** (``tf.raw_ops.DatasetToGraphV2``, what
  the graph walk before it paid on every run: every constant copied), for
  scale.

Beside them, the first walk of a freshly built pipeline (each round builds one):
what a run's start pays once.

``--quick``: 6,000 examples instead of 60,000, fewer rounds.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from tests.benchmarks.harness import Result

TARGET_MS = 5.0
TARGET_GROWTH = 2.0


def mnist_size_source(tf: Any, examples: int) -> Any:
    import numpy as np

    return tf.data.Dataset.from_tensor_slices((np.zeros((examples, 28, 28), np.float32), np.zeros(examples, np.int64)))


def pitfalls_pipeline(tf: Any, source: Any) -> Any:
    def slow(x: Any, y: Any) -> Any:
        return tf.py_function(lambda a: a, [x], tf.float32), y

    return source.map(lambda x, y: (x / 255.0, y)).map(slow).repeat().shuffle(100).batch(100)


def first_walk_seconds(tf: Any, source: Any) -> float:
    """The first walk of a freshly built pipeline: what a run's start pays once."""
    from tpudash.advice.pipeline import advise_pipeline

    dataset = pitfalls_pipeline(tf, source)
    started = time.perf_counter()
    advise_pipeline(dataset)
    return time.perf_counter() - started


def walk_seconds(dataset: Any, calls: int) -> float:
    """Seconds per ``advise_pipeline`` call, over ``calls`` calls."""
    from tpudash.advice.pipeline import advise_pipeline

    started = time.perf_counter()
    for _ in range(calls):
        advise_pipeline(dataset)
    return (time.perf_counter() - started) / calls


def serialise_seconds(tf: Any, dataset: Any) -> float:
    started = time.perf_counter()
    tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor, external_state_policy=1, strip_device_assignment=True
    ).numpy()
    return time.perf_counter() - started


def run(quick: bool) -> list[Result]:
    import tensorflow as tf

    from tpudash.advice.pipeline import advise_pipeline, rule_ids

    large_examples = 6_000 if quick else 60_000
    small_examples = 600
    large_source, small_source = mnist_size_source(tf, large_examples), mnist_size_source(tf, small_examples)
    large, small = pitfalls_pipeline(tf, large_source), pitfalls_pipeline(tf, small_source)
    fired = rule_ids(advise_pipeline(large))
    if fired != rule_ids(advise_pipeline(small)) or "cache" not in fired:
        raise AssertionError(f"the two sizes must get the same verdicts: {fired} vs {rule_ids(advise_pipeline(small))}")

    calls = 20 if quick else 200
    rounds = 3 if quick else 15
    large_walks, small_walks, serialised, large_firsts, small_firsts = [], [], [], [], []
    for round_index in range(rounds):  # alternated: load on the shared cores hits both alike
        large_walks.append(walk_seconds(large, calls))
        small_walks.append(walk_seconds(small, calls))
        large_firsts.append(first_walk_seconds(tf, large_source))
        small_firsts.append(first_walk_seconds(tf, small_source))
        if round_index < (1 if quick else 5):  # each one copies the whole source: a few are enough
            serialised.append(serialise_seconds(tf, large))
    large_ms = statistics.median(large_walks) * 1000
    small_ms = statistics.median(small_walks) * 1000
    serialise_ms = statistics.median(serialised) * 1000
    growth = large_ms / small_ms
    first_large_ms = statistics.median(large_firsts) * 1000
    first_small_ms = statistics.median(small_firsts) * 1000
    notes = (
        f"pitfalls pipeline (fires {', '.join(fired)}): walk {large_ms:.3f} ms for {large_examples:,}×28×28 float32 "
        f"({large_examples * (28 * 28 * 4 + 8) / 1e6:.0f} MB source), {small_ms:.3f} ms for {small_examples}×28×28; "
        f"ratio {growth:.2f}; the first walk of a freshly built pipeline {first_large_ms:.3f} ms and "
        f"{first_small_ms:.3f} ms; serialising the {large_examples:,}-example dataset (DatasetToGraphV2, the former "
        f"walk's first step) {serialise_ms:.1f} ms, {serialise_ms / large_ms:,.0f}× the walk. Medians of {rounds} "
        f"alternated rounds of {calls} walks (serialisation: {len(serialised)}); shared 2-core machine, noisy"
    )
    print(f"[advice_pipeline] {notes}", file=sys.stderr)
    samples = {
        "large_walk_seconds": large_walks,
        "small_walk_seconds": small_walks,
        "large_first_walk_seconds": large_firsts,
        "small_first_walk_seconds": small_firsts,
        "serialise_seconds": serialised,
    }
    return [
        Result(
            benchmark="advice_pipeline",
            figure=f"pipeline advice walk, {large_examples:,} MNIST-size examples",
            value=large_ms,
            unit="ms",
            baseline_name=f"the same walk, {small_examples} examples",
            baseline=small_ms,
            ratio=growth,
            target=f"≤ {TARGET_MS:g} ms and ≤ {TARGET_GROWTH:g}× the small walk",
            met=large_ms <= TARGET_MS and growth <= TARGET_GROWTH,
            samples=samples,
            notes=notes,
        ),
        Result(
            benchmark="advice_pipeline",
            figure=f"pipeline advice walk vs serialising the dataset, {large_examples:,} examples",
            value=large_ms,
            unit="ms",
            baseline_name="DatasetToGraphV2 (the former graph walk's first step)",
            baseline=serialise_ms,
            ratio=large_ms / serialise_ms,
            notes="for scale: what each run's start no longer pays",
        ),
    ]
