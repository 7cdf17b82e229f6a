"""``tpudash profile``: ask a live run's writer for a profile, read XProf's verdict, print it.

``tpudash profile RUN`` writes a request into the run (``tpudash.profiles.requests``), waits for
the writer's answer (requested → capturing steps A–B → converting, shown on a terminal), converts
the capture in a child (``tpudash.profiles.convert.summarize_run_capture``, xprof never in this
process) and prints the summary (``--json``: summary.json with ``run_id``, ``capture`` and
``profile_dir``). ``--list`` lists a run's captures and ``--capture NAME`` shows one, ended runs
too. ``tpudash profile --attach HOST:PORT --duration 2s`` captures by duration from any process
running a profiler server, as ``capture_tpu_profile`` did (``tpudash.profiles.attach_child``).

Exit codes: 0 a summary printed; 1 no capture (the writer's reason, no answer in time, the
converter's sentence, no xprof: the install line); 2 bad input (the flag and what it allows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpudash.cli.commands import reaching, readable_runs_dir
from tpudash.cli.exits import EXIT_DONE, EXIT_FAILED, BadInput

if TYPE_CHECKING:
    from rich.console import Console

    from tpudash.config import Settings
    from tpudash.profiles.summary import ProfileSummary
    from tpudash.runs.backends import RunFiles

MAX_STEPS = 1000
MAX_WORKER = 4095
# How long `tpudash profile RUN` waits for the writer's answer: it picks a request up within a
# second, between two steps, then profiles N of them (a slow model's steps take minutes).
DEFAULT_ANSWER_TIMEOUT = 300.0
# --duration: as capture_tpu_profile took it, a short window of a running program.
MIN_DURATION_SECONDS = 0.01
MAX_DURATION_SECONDS = 600.0
DEFAULT_DURATION_SECONDS = 2.0
# What the attaching child may take beyond the duration: connecting, and the server writing the capture.
ATTACH_GRACE_SECONDS = 60.0
DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*", re.IGNORECASE)
ADDRESS = re.compile(r"(?:grpc://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]*):(\d{1,5})")
POLL_SECONDS = 0.5


class NoCapture(Exception):
    """No profile to show: the one sentence the user reads (exit 1)."""


def add_profile_parser(commands: Any, flags: argparse.ArgumentParser, help_text: str) -> argparse.ArgumentParser:
    """``tpudash profile``'s parser, added to the subcommands."""
    profile = commands.add_parser(
        "profile",
        parents=[flags],
        help=help_text,
        description="Profile the next steps of a live run and print XProf's verdict: step time, its breakdown "
        "(input, compute, collectives, idle), the top ops, XProf's recommendations. The run's writer "
        "(tpudash run, TpudashCallback, tpudash.record) captures them with its framework's profiler into "
        "<run>/profile (xprof --logdir <run>/profile opens the full trace); reading it needs the "
        'profile extra: pip install "tpudash[profile]". Exit codes: 0 a summary printed, 1 no capture '
        "(the reason is said), 2 bad input.",
    )
    profile.add_argument("run_id", nargs="?", metavar="RUN", help="run id (a unique prefix is enough)")
    profile.add_argument("--steps", metavar="N", help="profile the next N steps (1 to 1000; default 5)")
    profile.add_argument(
        "--worker", metavar="I", help="profile worker I of a cluster's run (0 is the chief; default the chief)"
    )
    profile.add_argument("--json", action="store_true", help="print the summary as JSON (summary.json and where)")
    profile.add_argument("--list", action="store_true", help="list the run's captures, newest first (ended runs too)")
    profile.add_argument("--capture", metavar="NAME", help="show this capture of the run (converted if need be)")
    profile.add_argument(
        "--timeout",
        metavar="SECONDS",
        help=f"how long to wait for the writer's profile (default {DEFAULT_ANSWER_TIMEOUT:g})",
    )
    attach = profile.add_argument_group(
        "a process tpudash does not write",
        "--attach captures by duration from a process running a profiler server "
        "(tf.profiler.experimental.server.start(PORT), jax.profiler.start_server(PORT)).",
    )
    attach.add_argument("--attach", metavar="HOST:PORT", help="the profiler server's address")
    attach.add_argument(
        "--duration", metavar="TIME", help="how long to capture, e.g. 2s or 500ms (10ms to 10min; default 2s)"
    )
    attach.add_argument(
        "--logdir",
        metavar="DIR",
        help="where the capture goes (DIR/plugins/profile/…); default: RUN's profile folder if RUN is given, "
        "else one under $XDG_CACHE_HOME/tpudash/profiles",
    )
    return profile


# -- the flags, checked ------------------------------------------------------------


def checked_steps(text: str | None) -> int:
    from tpudash.profiles.requests import DEFAULT_PROFILE_STEPS

    if text is None:
        return DEFAULT_PROFILE_STEPS
    number = _whole(text)
    if number is None or not 1 <= number <= MAX_STEPS:
        raise BadInput(f"--steps: {text!r:.40} is not allowed; allowed: a whole number of steps from 1 to {MAX_STEPS}")
    return number


def checked_worker(text: str | None) -> int | None:
    if text is None:
        return None
    number = _whole(text)
    if number is None or not 0 <= number <= MAX_WORKER:
        raise BadInput(
            f"--worker: {text!r:.40} is not allowed; allowed: a worker index from 0 (the chief) to {MAX_WORKER}"
        )
    return number


def checked_timeout(text: str | None) -> float:
    if text is None:
        return DEFAULT_ANSWER_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadInput(f"--timeout: {text!r:.40} is not allowed; allowed: a number of seconds > 0")
    return seconds


def checked_duration(text: str | None) -> float:
    """``--duration`` in seconds: ``2s``, ``500ms``, ``1m``, or a bare number of seconds."""
    if text is None:
        return DEFAULT_DURATION_SECONDS
    match = DURATION.fullmatch(text)
    seconds = math.nan
    if match is not None:
        unit = (match.group(2) or "s").lower()
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0}[unit]
    if not MIN_DURATION_SECONDS <= seconds <= MAX_DURATION_SECONDS:
        raise BadInput(f"--duration: {text!r:.40} is not allowed; allowed: a time from 10ms to 10min, e.g. 2s or 500ms")
    return seconds


def checked_address(text: str) -> str:
    match = ADDRESS.fullmatch(text.strip())
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise BadInput(
            f"--attach: {text!r:.60} is not allowed; allowed: HOST:PORT of a profiler server, e.g. localhost:9012"
        )
    return f"{match.group(1)}:{int(match.group(2))}"


def checked_capture_name(name: str) -> str:
    from tpudash.profiles.requests import PLAIN_NAME_RULE, is_plain_name

    if not is_plain_name(name):
        raise BadInput(
            f"--capture: {name!r:.60} is not allowed; allowed: {PLAIN_NAME_RULE} (tpudash profile RUN --list)"
        )
    return name


def _whole(text: str) -> int | None:
    try:
        return int(text.strip(), 10)
    except ValueError:
        return None


def _refuse_together(args: argparse.Namespace, reason: str, names: Sequence[str]) -> None:
    for name in names:
        if getattr(args, name) not in (None, False):
            raise BadInput(f"--{name}: {reason}")


# -- the command ------------------------------------------------------------------


def command_profile(args: argparse.Namespace, settings: Settings) -> int:
    """Profile a live run (or show, or list, its captures; or attach to a profiler server)."""
    if args.attach is not None:
        _refuse_together(args, "not with --attach (it captures by --duration)", ("steps", "worker", "list", "capture"))
        return _attach(args, settings)
    for name in ("duration", "logdir"):
        if getattr(args, name) is not None:
            raise BadInput(f"--{name}: only with --attach HOST:PORT")
    if args.run_id is None:
        raise BadInput("RUN: name the run to profile (`tpudash runs` lists them), or --attach HOST:PORT")
    if args.list:
        _refuse_together(args, "not with --list", ("steps", "worker", "capture", "timeout"))
    elif args.capture is not None:
        _refuse_together(args, "not with --capture (it shows a capture already made)", ("steps", "worker", "timeout"))
    steps, worker = checked_steps(args.steps), checked_worker(args.worker)
    timeout = checked_timeout(args.timeout)
    capture = None if args.capture is None else checked_capture_name(args.capture)
    runs_dir = readable_runs_dir(settings)
    try:
        with reaching(runs_dir):
            files, run_id, status = _find_run(runs_dir, args.run_id)
            if args.list:
                return _list(files, run_id, args.json)
            if capture is None:
                capture = _profile_live(files, run_id, status, steps, worker, timeout)
            else:
                _check_capture(files, run_id, capture)
            summary = _summary(files, capture)
    except NoCapture as error:
        print(f"tpudash: {error}", file=sys.stderr)
        return EXIT_FAILED
    _show(summary, run_id, capture, profile_dir(files), args.json)
    return EXIT_DONE


def _find_run(runs_dir: Path | str, prefix: str) -> tuple[RunFiles, str, str]:
    """The run's files, its full id and its status (``running`` while its writer is live)."""
    from tpudash.runs.records import run_id_of
    from tpudash.runs.store import RunStore

    store = RunStore(runs_dir)
    try:
        run_id = run_id_of(store.find(prefix))
    except KeyError as error:
        raise BadInput(f"RUN: {error.args[0]}") from None
    return store.files(run_id), run_id, store.info(run_id).status


def profile_dir(files: RunFiles) -> str:
    """Where XProf's logdir of the run is: ``<run>/profile`` as a path, or a URL in a store."""
    from tpudash.profiles.requests import PROFILE_FOLDER

    if files.local_dir is not None:
        return str(files.local_dir / PROFILE_FOLDER)
    return f"{files.where.rstrip('/')}/{PROFILE_FOLDER}"


def cache_root() -> Path:
    """Where a bucket run's captures are downloaded to be converted: the user's cache."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "tpudash" / "profiles"


def _list(files: RunFiles, run_id: str, as_json: bool) -> int:
    from rich.table import Table

    from tpudash.cli.render import output_console
    from tpudash.format import format_timestamp
    from tpudash.profiles.summary import list_captures

    captures = list_captures(files)
    if as_json:
        listed = [
            {"capture": c.name, "hosts": list(c.hosts), "has_summary": c.has_summary, "started_at": c.started_at}
            for c in captures
        ]
        print(json.dumps({"run_id": run_id, "profile_dir": profile_dir(files), "captures": listed}, indent=2))
        return EXIT_DONE
    console = output_console(highlight=False)
    if not captures:
        console.print(f"run {run_id} has no profile yet (tpudash profile {run_id} asks its writer for one)")
        return EXIT_DONE
    table = Table(title=f"profiles of {run_id} in {profile_dir(files)}", title_justify="left")
    for column in ("capture", "started", "hosts", "summary"):
        table.add_column(column, no_wrap=column == "capture")
    for info in captures:
        started = format_timestamp(info.started_at) if info.started_at else "-"
        table.add_row(info.name, started, ", ".join(info.hosts), "yes" if info.has_summary else "not yet")
    console.print(table)
    return EXIT_DONE


def _profile_live(files: RunFiles, run_id: str, status: str, steps: int, worker: int | None, timeout: float) -> str:
    """Ask the run's writer for ``steps`` steps and wait for its capture; its folder's name, or NoCapture."""
    from tpudash.profiles.convert import PROFILE_EXTRA_INSTALL, xprof_available
    from tpudash.profiles.requests import FINAL_STATES, STATE_CAPTURING, STATE_DONE, request_profile, wait_for_answer
    from tpudash.runs.layout import STATUS_RUNNING

    if status != STATUS_RUNNING:
        raise NoCapture(f"run {run_id} is not live ({status}): nothing is training to profile")
    if not xprof_available():
        raise NoCapture(f"reading a profile needs xprof: {PROFILE_EXTRA_INSTALL}")
    try:
        request = request_profile(files, steps, worker)
    except ValueError as error:
        raise BadInput(str(error)) from None
    writer = "the writer" if worker is None else f"worker {worker}"
    deadline = time.monotonic() + timeout
    with _progress() as say:
        say(f"requested a profile of the next {steps} steps of {run_id} from {writer}")
        answer = wait_for_answer(
            files, request.id, until_state=(STATE_CAPTURING, *FINAL_STATES), timeout=timeout, poll=POLL_SECONDS
        )
        if answer is not None and answer.state == STATE_CAPTURING:
            first = answer.first_step
            span = f" {first}–{first + steps - 1}" if first is not None else ""
            say(f"{answer.host}: capturing steps{span} of {run_id}")
            left = max(0.0, deadline - time.monotonic())
            answer = wait_for_answer(files, request.id, timeout=left, poll=POLL_SECONDS) or answer
        if answer is None:
            raise NoCapture(
                f"no answer from {writer} of {run_id} in {timeout:g} s: it checks for requests once a second, "
                "between steps (is it between epochs, or stuck? --timeout waits longer)"
            )
        if answer.state == STATE_CAPTURING:
            raise NoCapture(
                f"{writer} of {run_id} began the profile but did not finish it in {timeout:g} s "
                "(slow steps? --timeout waits longer; the capture may still land: tpudash profile RUN --list)"
            )
        if answer.state != STATE_DONE or answer.capture is None:
            raise NoCapture(f"{writer} of {run_id} could not profile: {answer.reason or 'it gave no reason'}")
        if answer.reason:
            print(f"tpudash: {answer.reason}", file=sys.stderr)
        say(f"converting the capture of steps {answer.first_step}–{answer.last_step} with XProf")
        return answer.capture


def _check_capture(files: RunFiles, run_id: str, capture: str) -> None:
    """BadInput naming the run's captures unless ``capture`` is one of them."""
    from tpudash.profiles.summary import list_captures

    names = [info.name for info in list_captures(files)]
    if capture not in names:
        listed = ", ".join(names[:5]) + (", …" if len(names) > 5 else "") if names else "none yet"
        raise BadInput(f"--capture: run {run_id} has no capture {capture!r}; its captures: {listed}")


def _summary(files: RunFiles, capture: str) -> ProfileSummary:
    """The capture's summary, converted (in a child) if it has none yet; NoCapture with the converter's sentence."""
    from tpudash.profiles.convert import ProfileError, summarize_run_capture

    try:
        return summarize_run_capture(files, capture, cache_root=cache_root())
    except ProfileError as error:
        raise NoCapture(str(error)) from None


@contextmanager
def _progress() -> Iterator[Any]:
    """``say(text)``: what the wait is at, as a spinner on a terminal's stderr; nothing into a pipe."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda text: None
        return
    with console.status("") as status:
        yield lambda text: status.update(text)


# -- the summary, printed -----------------------------------------------------------


def _show(summary: ProfileSummary, run_id: str | None, capture: str, where: str, as_json: bool) -> None:
    if as_json:
        payload = dict(summary.to_json())
        payload.update(run_id=run_id, capture=capture, profile_dir=where)
        print(json.dumps(payload, indent=2))
        return
    from tpudash.cli.render import output_console

    render_summary(summary.to_json(), run_id, capture, where, output_console(highlight=False))


def render_summary(summary: dict, run_id: str | None, capture: str, where: str, console: Console) -> None:
    """A summary as a user reads it: step time, its breakdown, the verdict, top ops, XProf's advice."""
    from rich.table import Table
    from rich.text import Text

    of_run = f" of {run_id}" if run_id else ""
    console.print(
        Text.assemble(
            ("profile ", "bold"),
            (capture, "bold cyan"),
            f"{of_run}: {summary.get('steps', 0)} steps, {summary.get('framework', '?')} on "
            f"{summary.get('hardware', '?')} ({', '.join(summary.get('hosts') or ()) or 'no host'})",
        )
    )
    times = summary.get("step_time_ms") or {}
    if times.get("avg") is not None:
        console.print(
            f"step time: avg {_ms(times.get('avg'))}, min {_ms(times.get('min'))}, max {_ms(times.get('max'))}, "
            f"σ {_ms(times.get('std'))}"
        )
    breakdown = summary.get("breakdown") or {}
    if breakdown:
        parts = [f"{name.replace('_', ' ')} {value:.1f} %" for name, value in breakdown.items() if value is not None]
        console.print("breakdown (% of step time): " + ", ".join(parts))
    verdict = summary.get("verdict", "unknown")
    style = {"input-bound": "bold yellow", "not input-bound": "bold green"}.get(verdict, "bold")
    percent = summary.get("input_percent")
    console.print(
        Text.assemble(
            ("verdict: ", "bold"),
            (verdict, style),
            f" (input {percent:.1f} % of step time)" if percent is not None else "",
        )
    )
    for label, key in (("input", "input_conclusion"), ("bottleneck", "bottleneck")):
        if summary.get(key):
            console.print(Text.assemble((f"{label}: ", "dim"), summary[key]))
    utilisation = summary.get("utilisation") or {}
    if utilisation:
        console.print("utilisation: " + "; ".join(_utilisation(name, value) for name, value in utilisation.items()))
    ops = summary.get("top_ops") or []
    if ops:
        table = Table(title=f"top ops by self time ({summary.get('top_ops_source', '')})", title_justify="left")
        for column in ("op", "type", "self %", "self ms"):
            table.add_column(column, justify="right" if column.startswith("self") else "left", overflow="fold")
        for op in ops[:10]:
            table.add_row(
                str(op.get("name")), str(op.get("type")), _number(op.get("self_percent")), _number(op.get("self_ms"))
            )
        console.print(table)
    stages = summary.get("input_stages") or []
    if stages:
        console.print(
            "slowest input stages: " + "; ".join(f"{s.get('name')} {_ms(s.get('self_ms'))}" for s in stages[:5])
        )
    for heading, key in (("recommendations", "recommendations"), ("notes", "notes")):
        lines = summary.get(key) or []
        if lines:
            console.print(Text(f"{heading}:", style="bold"))
            for line in lines:
                console.print(Text(f"- {line}"))
    console.print(Text.assemble(("full trace: ", "dim"), f"xprof --logdir {where}"))


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def _number(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def _utilisation(name: str, value: Any) -> str:
    label = name.replace("_", " ")
    if isinstance(value, dict):
        if value.get("percent") is not None:
            return f"{label} {float(value['percent']):.1f} %"
        return f"{label} {value.get('note') or 'not measured'}"
    return f"{label} {value}"


# -- --attach: a profiler server's process ----------------------------------------------


def _attach(args: argparse.Namespace, settings: Settings) -> int:
    """Capture ``--duration`` from the profiler server at ``--attach``, convert it, print it."""
    address = checked_address(args.attach)
    seconds = checked_duration(args.duration)
    _refuse_together(args, "not with --attach (it waits --duration)", ("timeout",))
    files: RunFiles | None = None
    run_id = None
    if args.run_id is not None and args.logdir is not None:
        raise BadInput("--logdir: not with RUN (the capture goes into RUN's profile folder)")
    from tpudash.profiles.convert import PROFILE_EXTRA_INSTALL, ProfileError, convert_capture, xprof_available

    if args.run_id is not None:
        runs_dir = readable_runs_dir(settings)
        with reaching(runs_dir):
            files, run_id, _status = _find_run(runs_dir, args.run_id)
    if not xprof_available():
        print(f"tpudash: capturing from a profiler server needs xprof: {PROFILE_EXTRA_INSTALL}", file=sys.stderr)
        return EXIT_FAILED
    if files is not None and files.local_dir is not None:
        logdir = profile_dir(files)
    elif args.logdir is not None:
        logdir = args.logdir
    else:
        logdir = str(cache_root() / f"attach-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    try:
        with _progress() as say:
            say(f"capturing {seconds:g} s from the profiler server at {address}")
            capture_dir = capture_by_duration(address, Path(logdir), seconds)
            if files is not None and files.local_dir is None:
                _upload_capture(files, capture_dir)
            say("converting the capture with XProf")
            summary = convert_capture(capture_dir)
    except (NoCapture, ProfileError) as error:
        print(f"tpudash: {error}", file=sys.stderr)
        return EXIT_FAILED
    where = profile_dir(files) if files is not None else logdir
    _show(summary, run_id, capture_dir.name, where, args.json)
    return EXIT_DONE


def capture_by_duration(address: str, logdir: Path, seconds: float) -> Path:
    """The capture folder of ``seconds`` traced from the profiler server at ``address``, taken by a child.

    The child (``tpudash.profiles.attach_child``) uses xprof's client, which needs no TensorFlow;
    this process never imports xprof. NoCapture with the child's last words when nothing came back.
    """
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(_capture_dirs(logdir))
    command = [sys.executable, "-m", "tpudash.profiles.attach_child", address, str(logdir), str(round(seconds * 1000))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + ATTACH_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        raise NoCapture(
            f"the profiler server at {address} gave no capture in {seconds + ATTACH_GRACE_SECONDS:g} s"
        ) from None
    new = [path for path in _capture_dirs(logdir) if path not in before]
    if done.returncode != 0 or not new:
        raise NoCapture(f"no capture from the profiler server at {address}: {_why_no_capture(done)}")
    return max(new, key=lambda path: path.name)


def _why_no_capture(done: subprocess.CompletedProcess) -> str:
    """The child's last line (its own: the error it caught), or what the profiler client logged that says more."""
    said = done.stderr or ""
    if "Connection refused" in said:
        return (
            "connection refused: is a profiler server listening there? "
            "(tf.profiler.experimental.server.start(PORT), jax.profiler.start_server(PORT))"
        )
    last = [line.strip() for line in said.splitlines() if line.strip()]
    return last[-1] if last else f"the capturing child ended with exit {done.returncode} and said nothing"


def _capture_dirs(logdir: Path) -> list[Path]:
    return [path for path in (logdir / "plugins" / "profile").glob("*") if path.is_dir()]


def _upload_capture(files: RunFiles, capture_dir: Path) -> None:
    """A capture taken on this host put into a store run's profile folder, file by file."""
    from tpudash.profiles.requests import CAPTURES_FOLDER

    for path in sorted(capture_dir.iterdir()):
        if path.is_file():
            files.write(f"{CAPTURES_FOLDER}/{capture_dir.name}/{path.name}", path.read_bytes())
