"""Target 4: the matmul job's GFLOP/s on one CPU device ≥ 0.9 × NumPy's ``@`` at 2048³ float32.

Both sides run in this process, alternated: one matmul job run on
/device:CPU:0 (its own reported median GFLOP/s), then NumPy's ``a @ b`` timed
the same way (median of the same number of repeats).
"""

from __future__ import annotations

import statistics
import time

from tests.benchmarks.harness import Result, alternate


def run(quick: bool) -> list[Result]:
    import numpy as np

    from jobs import get_job
    from tpudash.accel.runtime import get_runtime
    from tpudash.config import Settings
    from tpudash.engine.runner import Runner

    size = 256 if quick else 2048
    repeats = 3 if quick else 10
    rounds = 1 if quick else 5
    runtime = get_runtime(Settings())
    runner = Runner(lambda: runtime, None)
    spec = get_job("matmul")
    params = spec.resolve({"m": size, "k": size, "n": size, "devices": "0", "repeats": repeats})
    generator = np.random.default_rng(0)
    a = generator.standard_normal((size, size), dtype=np.float32)
    b = generator.standard_normal((size, size), dtype=np.float32)
    flops = 2.0 * size**3

    def tpudash_gflops() -> float:
        run = runner.run_now(spec, params)
        return next(iter(run.summary["gflops"].values()))

    def numpy_gflops() -> float:
        a @ b  # warm-up, as the job warms up
        durations = []
        for _ in range(repeats):
            started = time.perf_counter()
            a @ b
            durations.append(time.perf_counter() - started)
        return flops / statistics.median(durations) / 1e9

    ours, numpy_side = alternate(tpudash_gflops, numpy_gflops, rounds)
    value, baseline = statistics.median(ours), statistics.median(numpy_side)
    ratio = value / baseline
    return [
        Result(
            benchmark="matmul",
            figure=f"matmul job GFLOP/s, {size}³ float32, /device:CPU:0",
            value=value,
            unit="GFLOP/s",
            baseline_name="NumPy @",
            baseline=baseline,
            ratio=ratio,
            target="≥ 0.9",
            met=ratio >= 0.9,
            samples={"tpudash": ours, "numpy": numpy_side},
        )
    ]
