"""Run the benchmarks: ``python -m tests.benchmarks [--quick] [--only NAME,...] [--json PATH]``.

Prints one table (figure, baseline, ratio, target, met) and writes it as
JSON. ``--quick`` runs every benchmark on tiny sizes (seconds, not minutes:
the smoke test uses it; its figures mean nothing). A benchmark that fails
gets a row saying why, and the exit code is 1; missed targets do not change
the exit code (the table says so).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Before anything imports TensorFlow: quiet C++ logs, no network for tfds,
# and no benchmark run lands in the user's own runs directory.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TFDS_DISABLE_GCS", "1")
os.environ.setdefault("TPUDASH_RUNS_DIR", tempfile.mkdtemp(prefix="tpudash-bench-runs-"))

from tests.benchmarks.harness import LoadMonitor, Result, report  # noqa: E402

# Name → module; run in this order: the subprocess-only benchmark first, then
# the two whose dashboard runs in this process with its engine in another
# (before anything here imports TensorFlow, as in a user's dashboard: its
# objects would lengthen this process's garbage collections), the rest, the
# longest last.
BENCHMARKS = {
    "first_frame": "tests.benchmarks.bench_first_frame",
    "key_latency": "tests.benchmarks.bench_key_latency",
    "tmux_keys": "tests.benchmarks.bench_tmux_keys",
    "quit": "tests.benchmarks.bench_quit",
    "plot_lag": "tests.benchmarks.bench_plot_lag",
    "cancel": "tests.benchmarks.bench_cancel",
    "matmul": "tests.benchmarks.bench_matmul",
    "history": "tests.benchmarks.bench_history",
    "event_parse": "tests.benchmarks.bench_event_parse",
    "advice_pipeline": "tests.benchmarks.bench_advice_pipeline",
    "advice_cost": "tests.benchmarks.bench_advice_cost",
    "pipeline": "tests.benchmarks.bench_pipeline",
    "callback": "tests.benchmarks.bench_callback",
    "profile_cost": "tests.benchmarks.bench_profile_cost",
    "keras_jax": "tests.benchmarks.bench_keras_jax",
    "bucket": "tests.benchmarks.bench_bucket",
    "telemetry": "tests.benchmarks.bench_telemetry",
    "hosts": "tests.benchmarks.bench_hosts",
    "agent": "tests.benchmarks.bench_agent",
    "overhead": "tests.benchmarks.bench_overhead",
    "watch_cost": "tests.benchmarks.bench_watch_cost",
    "headless_cost": "tests.benchmarks.bench_headless_cost",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks the suite works")
    parser.add_argument(
        "--only", metavar="NAME,...", default="", help=f"run only these benchmarks (of: {', '.join(BENCHMARKS)})"
    )
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.only.split(",") if name.strip()] or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"--only: unknown benchmark {', '.join(unknown)}; allowed: {', '.join(BENCHMARKS)}")
    args.names = [name for name in BENCHMARKS if name in names]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[Result] = []
    failed = False
    for name in args.names:
        started = time.perf_counter()
        print(f"[{name}] running{' (quick)' if args.quick else ''}…", file=sys.stderr, flush=True)
        with LoadMonitor() as load:
            try:
                produced = importlib.import_module(BENCHMARKS[name]).run(args.quick)
            except Exception as error:  # noqa: BLE001 - one broken benchmark must not hide the others
                failed = True
                traceback.print_exc()
                produced = [
                    Result(
                        benchmark=name,
                        figure="(failed)",
                        value=float("nan"),
                        unit="",
                        notes=f"{type(error).__name__}: {error}",
                    )
                ]
        seconds = time.perf_counter() - started
        for result in produced:
            result.samples.setdefault("benchmark_seconds", round(seconds, 1))
            result.samples.setdefault("external_load_cores", round(load.external_cores, 2))
            result.samples.setdefault("own_load_cores", round(load.own_cores, 2))
        print(
            f"[{name}] {seconds:.1f} s; other processes kept {load.external_cores:.2f} cores busy meanwhile "
            f"(this one {load.own_cores:.2f})",
            file=sys.stderr,
            flush=True,
        )
        results.extend(produced)
    report(results, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
