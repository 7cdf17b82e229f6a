"""A small mutation pass: which small breakages of one module do its tests fail to notice?

Run from the root of the tree under test (its code is what gets copied and mutated)::

    .venv/bin/python -m tests.mutation tpudash/runs/liveness.py \\
        --tests tests/unit/test_writer_liveness.py tests/unit/test_records.py [--timeout 60] \\
        [--max-mutants 60 --seed 38] [--list]

The tree's files (git's tracked and untracked-but-not-ignored ones, as they are on disk) are copied
once to a scratch directory; the tree itself is never written. Each mutant is one change to the
module, swapped into the copy alone, then ``pytest -x -q -p no:randomly TESTS`` runs there: a test
failing (or the tests not even importing) kills it, a run past ``--timeout`` seconds is killed and
counted as killed (and as a timeout), a clean pass is a survivor. The tests first run on the
unmutated copy: if they fail there, nothing is measured.

The mutants (each alone):
- a comparison flipped: ``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``, ``is`` ↔ ``is not``, ``in`` ↔ ``not in``;
- ``and`` ↔ ``or``; ``not x`` → ``x``; ``True`` ↔ ``False``;
- a number ``n`` → ``n + 1``, and ``0`` ↔ ``1``;
- ``return X`` → ``return None``;
- a statement that is a call (``os._exit(1)``, ``lock.release()``) or a ``raise``, replaced by ``pass``.
Annotations (never evaluated here: ``from __future__ import annotations``), f-strings, ``if
TYPE_CHECKING:`` blocks and lines marked ``# pragma: no mutate`` are left alone.

``--max-mutants N`` runs N of them spread evenly over the module (a systematic sample whose offset
comes from ``--seed``, 38 unless given): the same N and seed pick the same mutants of the same source.
``--list`` prints the mutants without running anything. The summary ends the output: total, killed,
survived, timeouts, then each survivor's line and change.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 38
PRAGMA = "pragma: no mutate"
SHOWN_CHARS = 110  # a mutant's description, cut
FLIPPED_COMPARISONS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One change: the bytes ``start:end`` of the module's source replaced by ``replacement``."""

    line: int
    start: int
    end: int
    replacement: str
    description: str

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


def _left_alone(tree: ast.Module, lines: list[bytes]) -> set[int]:
    """The ids of nodes no mutant touches: annotations, f-strings, TYPE_CHECKING blocks, pragma'd lines."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.JoinedStr):
            roots.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            roots.append(node)
        elif hasattr(node, "lineno") and PRAGMA.encode() in lines[node.lineno - 1]:
            roots.append(node)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def find_mutants(source: bytes) -> list[Mutant]:
    """Every mutant of ``source`` (a module's text) that still compiles, in source order, no two alike."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    line_starts = [0]
    for text in lines:
        line_starts.append(line_starts[-1] + len(text))
    skipped = _left_alone(tree, lines)
    found: list[Mutant] = []

    def span(node: ast.AST) -> tuple[int, int, str]:  # positions are UTF-8 byte offsets
        start = line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end, " ".join(source[start:end].decode().split())

    def add(node: ast.AST, replacement: str, description: str = "") -> None:
        start, end, original = span(node)
        description = description or f"{original} → {replacement}"
        shown = description if len(description) <= SHOWN_CHARS else description[: SHOWN_CHARS - 1] + "…"
        found.append(Mutant(node.lineno, start, end, replacement, shown))  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Compare):
            for index, operator in enumerate(node.ops):
                if type(operator) in FLIPPED_COMPARISONS:
                    flipped = copy.deepcopy(node)
                    flipped.ops[index] = FLIPPED_COMPARISONS[type(operator)]()
                    add(node, f"({ast.unparse(flipped)})")
        elif isinstance(node, ast.BoolOp):
            swapped = copy.deepcopy(node)
            swapped.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add(node, f"({ast.unparse(swapped)})")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add(node, f"({span(node.operand)[2]})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            add(node, str(not node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            kind = type(node.value)
            for value in [node.value + 1] + ([kind(1)] if node.value == 0 else [kind(0)] if node.value == 1 else []):
                add(node, repr(value))
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                add(node, "return None")
        elif isinstance(node, ast.Raise) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            add(node, "pass", f"removed: {span(node)[2]}")
    mutants, seen = [], {source}
    for mutant in sorted(found, key=lambda m: (m.start, m.end, m.replacement)):
        mutated = mutant.apply(source)
        if mutated in seen:
            continue
        seen.add(mutated)
        try:
            compile(mutated, "<mutant>", "exec")
        except SyntaxError:
            continue
        mutants.append(mutant)
    return mutants


def evenly_sampled(mutants: list[Mutant], count: int | None, seed: int) -> list[Mutant]:
    """``count`` of ``mutants`` spread evenly over the module (offset from ``seed``); all when None or enough."""
    if count is None or count >= len(mutants):
        return mutants
    step = len(mutants) / count
    offset = random.Random(seed).random() * step
    return [mutants[int(offset + index * step)] for index in range(count)]


def copy_tree(root: Path, scratch: Path) -> None:
    """The tree's files as they are on disk (tracked, and untracked but not ignored) copied under ``scratch``."""
    listing = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listing.split("\0")):
        source = root / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the work tree, not yet in git
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, scratch / name, follow_symlinks=False)


def run_tests(scratch: Path, tests: list[str], timeout: float | None) -> tuple[str, str]:
    """The tests run in ``scratch``: ("passed" | "failed" | "timeout", the output's last lines)."""
    environment = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(scratch), os.environ.get("PYTHONPATH")]))
    )
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:randomly", *tests]
    process = subprocess.Popen(
        command, cwd=scratch, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the session it was started in: pytest and whatever it started
        process.communicate()
        return "timeout", ""
    tail = "\n".join(output.decode(errors="replace").splitlines()[-15:])
    return ("passed" if process.returncode == 0 else "failed"), tail


def swap_in(scratch: Path, module: str, source: bytes) -> None:
    """``source`` as the copy's ``module``, with its cached bytecode gone (a same-size swap in the same second would reuse it)."""
    target = scratch / module
    target.write_bytes(source)
    for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        cached.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    parser.add_argument(
        "module", help="the module to mutate, relative to the tree's root (e.g. tpudash/runs/liveness.py)"
    )
    parser.add_argument("--tests", nargs="+", required=True, help="test files, relative to the root, fastest first")
    parser.add_argument("--timeout", type=float, help="seconds per mutant's run (default: 3 × the unmutated run + 10)")
    parser.add_argument("--max-mutants", type=int, help="run this many, spread evenly over the module")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"the sample's offset (default {DEFAULT_SEED})")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the tree under test (default: here)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    options = parser.parse_args(argv)
    root = options.root.resolve()
    source = (root / options.module).read_bytes()
    every = find_mutants(source)
    chosen = evenly_sampled(every, options.max_mutants, options.seed)
    sampled = (
        f" (a sample of {len(every)}: --max-mutants {options.max_mutants} --seed {options.seed})"
        if len(chosen) < len(every)
        else ""
    )
    print(f"{options.module}: {len(chosen)} mutants{sampled}; tests: {' '.join(options.tests)}", flush=True)
    if options.list:
        for mutant in chosen:
            print(f"  line {mutant.line}: {mutant.description}")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="tpudash-mutation-"))
    try:
        copy_tree(root, scratch)
        started = time.monotonic()
        outcome, tail = run_tests(scratch, options.tests, None)
        baseline = time.monotonic() - started
        if outcome != "passed":
            print(f"the tests fail on the unmutated module; nothing measured:\n{tail}", file=sys.stderr)
            return 2
        timeout = options.timeout or 3 * baseline + 10
        print(f"unmutated run: passed in {baseline:.1f} s; timeout per mutant {timeout:.0f} s", flush=True)
        survivors, timeouts = [], 0
        for number, mutant in enumerate(chosen, 1):
            swap_in(scratch, options.module, mutant.apply(source))
            outcome, _ = run_tests(scratch, options.tests, timeout)
            timeouts += outcome == "timeout"
            if outcome == "passed":
                survivors.append(mutant)
            verdict = {"passed": "SURVIVED", "failed": "killed", "timeout": "killed (timeout)"}[outcome]
            print(f"[{number}/{len(chosen)}] {verdict}: line {mutant.line}: {mutant.description}", flush=True)
        swap_in(scratch, options.module, source)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{options.module}: total {len(chosen)}{sampled}, killed {len(chosen) - len(survivors)}, "
          f"survived {len(survivors)}, timeouts {timeouts} (counted as killed)")  # fmt: skip
    for mutant in survivors:
        print(f"  survived: line {mutant.line}: {mutant.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
