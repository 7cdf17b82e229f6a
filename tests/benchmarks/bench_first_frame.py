"""Target 2: first frame ≤ 0.25 s (and ≤ 0.25 × ``python -c "import tensorflow"``); the dashboard never imports TensorFlow.

The TUI runs in a real pseudo-terminal with TPUDASH_EXIT_AFTER_FIRST_FRAME=1:
it prints the wall-clock time of its first rendered frame and whether
``tensorflow`` was in its ``sys.modules`` then, and exits. The time from
spawning the process to that frame is compared with the wall time of a bare
TensorFlow import, and with a bare Textual app's first frame
(``tests.benchmarks.bare_textual_app``: what this machine takes to draw any
Textual app), the three taken turn about. The dashboard process must not have
imported TensorFlow at its first frame (the engine process owns it): a row
counts the launches in which it had.

The import-time profile: one more launch under ``python -X importtime``,
its import lines (up to the first frame) parsed; a row gives the total of
the top-level imports' cumulative times and its notes the heaviest modules
(cumulative, inflated by the profiler). The whole list, as a command:
``python -m tests.benchmarks.bench_first_frame --importtime [N] [DEPTH]``.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from tests.benchmarks.harness import Result
from tests.terminal import run_on_a_terminal

IMPORT_TIME_LINE = re.compile(rb"import time:\s*(\d+) \|\s*(\d+) \| ( *)(\S+)")
FIRST_FRAME = re.compile(rb"first_frame_unix=([0-9.]+)")
TENSORFLOW_IMPORTED = re.compile(rb"tensorflow_imported=(True|False|None)")
MODULES_AT_FIRST_FRAME = re.compile(rb"modules_at_first_frame=(\S*)")
TARGET_SECONDS = 0.25
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET_RATIO = 0.25


def first_frame_seconds(python: str = sys.executable, runs_dir: str | None = None, cwd: str | None = None) -> float:
    """Spawn ``python -m tpudash`` on a pty (120×40) and return seconds to its first frame."""
    return first_frame_probe(python, runs_dir, cwd)["seconds"]


def first_frame_probe(
    python: str = sys.executable,
    runs_dir: str | None = None,
    cwd: str | None = None,
    module: str = "tpudash",
) -> dict:
    """Spawn ``python -m tpudash`` on a pty (120×40): seconds to its first frame, and whether TensorFlow was loaded then.

    ``tensorflow_imported`` is True, False, or None when the app did not say. ``module``: another app that
    prints its ``first_frame_unix=`` (``tests.benchmarks.bare_textual_app``).
    """
    environment = dict(
        os.environ,
        TPUDASH_EXIT_AFTER_FIRST_FRAME="1",
        TERM="xterm-256color",
        TPUDASH_RUNS_DIR=runs_dir or tempfile.mkdtemp(prefix="tpudash-bench-"),
    )
    started = time.time()
    returncode, output = run_on_a_terminal([python, "-m", module], environment, timeout=60, cwd=cwd)
    match = FIRST_FRAME.search(output)
    if match is None:
        raise RuntimeError(f"tpudash printed no first-frame time (exit {returncode}): {output[-500:]!r}")
    imported = TENSORFLOW_IMPORTED.search(output)
    said = imported.group(1).decode() if imported is not None else "None"
    return {"seconds": float(match.group(1)) - started, "tensorflow_imported": {"True": True, "False": False}.get(said)}


def import_profile(python: str = sys.executable, cwd: str | None = None) -> list[tuple[int, int, int, str]]:
    """``python -X importtime -m tpudash`` to its first frame: (depth, self µs, cumulative µs, module) per import."""
    environment = dict(
        os.environ,
        TPUDASH_EXIT_AFTER_FIRST_FRAME="1",
        TERM="xterm-256color",
        TPUDASH_RUNS_DIR=tempfile.mkdtemp(prefix="tpudash-bench-"),
        TPUDASH_NATIVE_STDERR="terminal",  # -X importtime writes to fd 2, which the dashboard otherwise logs
    )
    returncode, output = run_on_a_terminal([python, "-X", "importtime", "-m", "tpudash"], environment, 60, cwd=cwd)
    if FIRST_FRAME.search(output) is None:
        raise RuntimeError(f"tpudash printed no first-frame time under -X importtime (exit {returncode})")
    # Only what was imported before the frame. The first-frame line is printed as the app exits, after what
    # the frame let go on (the engine's start, the screens built ahead): the modules loaded at the frame say.
    before_exit = output[: output.index(b"first_frame_unix=")]
    loaded = MODULES_AT_FIRST_FRAME.search(output)
    at_frame = set(loaded.group(1).decode().split(",")) if loaded is not None else None
    return [
        (len(indent) // 2, int(own), int(cumulative), name.decode())
        for own, cumulative, indent, name in IMPORT_TIME_LINE.findall(before_exit)
        if at_frame is None or name.decode() in at_frame
    ]


def heaviest_imports(profile: list[tuple[int, int, int, str]], count: int, depth: int = 2) -> list[tuple[int, str]]:
    """The ``count`` largest cumulative times (µs) among imports at most ``depth`` deep, largest first."""
    shallow = [(cumulative, "  " * level + name) for level, _, cumulative, name in profile if level <= depth]
    return sorted(shallow, reverse=True)[:count]


def import_tensorflow_seconds() -> float:
    """A bare ``import tensorflow``, as tpudash itself imports it on this host (libtpu kept unloaded without a chip)."""
    from tpudash.accel.hostcheck import scan_chips
    from tpudash.accel.runtime import keep_libtpu_unloaded

    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if not scan_chips().count:
        keep_libtpu_unloaded(environment)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True, env=environment)
    return time.perf_counter() - started


def run(quick: bool) -> list[Result]:
    rounds = 1 if quick else 7
    probes: list[dict] = []

    def measure_frame() -> float:
        probes.append(first_frame_probe())
        return probes[-1]["seconds"]

    def measure_bare_frame() -> float:
        # The repository's root on the path: the bare app is a module of the benchmarks.
        return first_frame_probe(module="tests.benchmarks.bare_textual_app", cwd=REPOSITORY)["seconds"]

    frames, imports, bare_frames = [], [], []
    for _ in range(rounds):  # turn about: drift and background load hit all three alike
        frames.append(measure_frame())
        bare_frames.append(measure_bare_frame())
        imports.append(import_tensorflow_seconds())
    frame, baseline, bare = statistics.median(frames), statistics.median(imports), statistics.median(bare_frames)
    ratio = frame / baseline
    imported = [probe["tensorflow_imported"] for probe in probes]
    # None (the app did not say) counts as imported: the row must prove the absence.
    with_tensorflow = sum(1 for value in imported if value is not False)
    profile = import_profile()
    total_ms = sum(cumulative for level, _, cumulative, _ in profile if level == 0) / 1000
    heaviest = "; ".join(f"{name.strip()} {micros / 1000:.0f}" for micros, name in heaviest_imports(profile, 12))
    return [
        Result(
            "first_frame",
            "time to first frame",
            frame,
            "s",
            "import tensorflow",
            baseline,
            ratio,
            f"≤ {TARGET_RATIO:g} × import",
            ratio <= TARGET_RATIO,
            {"first_frame": frames, "import_tensorflow": imports},
            notes=f"min {min(frames):.3f} s, max {max(frames):.3f} s over {len(frames)} launches",
        ),
        Result(
            "first_frame",
            "time to first frame, absolute",
            frame,
            "s",
            target=f"≤ {TARGET_SECONDS:g} s",
            met=frame <= TARGET_SECONDS,
        ),
        Result(
            "first_frame",
            "the first frame's own part: the dashboard's beyond a bare Textual app's (a header, a line, the footer)",
            frame - bare,
            "s",
            samples={"first_frame": frames, "bare_textual_app": bare_frames},
            notes=f"medians, taken turn about: the dashboard {frame:.3f} s, a bare Textual app {bare:.3f} s "
            f"(min {min(bare_frames):.3f}, max {max(bare_frames):.3f}): what this machine takes to draw any Textual app",
        ),
        Result(
            "first_frame",
            "launches whose dashboard had imported tensorflow at its first frame",
            float(with_tensorflow),
            f"of {len(imported)}",
            target="0",
            met=with_tensorflow == 0,
            samples={"tensorflow_imported": imported},
            notes="from the app's tensorflow_imported= line (TPUDASH_EXIT_AFTER_FIRST_FRAME)",
        ),
        Result(
            "first_frame",
            "imports before the first frame (-X importtime, top-level cumulative)",
            total_ms,
            "ms",
            samples={"modules": len(profile)},
            notes=f"{len(profile)} modules loaded at the first frame (the app names them as it draws it); heaviest "
            f"(cumulative ms, ≤ 2 deep): {heaviest}",
        ),
    ]


def main(argv: list[str]) -> int:
    """``--importtime [N] [DEPTH]``: the N heaviest imports before the first frame, indented by depth."""
    if not argv or argv[0] != "--importtime":
        print(__doc__)
        return 2
    count = int(argv[1]) if len(argv) > 1 else 30
    depth = int(argv[2]) if len(argv) > 2 else 3
    profile = import_profile()
    print(
        f"{len(profile)} modules imported before the first frame; top-level cumulative total "
        f"{sum(c for level, _, c, _ in profile if level == 0) / 1000:.1f} ms"
    )
    for micros, name in heaviest_imports(profile, count, depth):
        print(f"{micros / 1000:8.1f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
