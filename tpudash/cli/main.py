"""Argument parsing and the subcommands of ``tpudash``.

``tpudash`` alone starts the TUI, in a terminal only: without one (a pipe, a
file, a notebook cell) it exits 2 at once and points to the headless commands.
``devices``, ``jobs``, ``run``, ``runs``, ``watch``, ``telemetry`` and
``export`` work headless for notebooks, scripts and CI. Global flags
(``--tpu``, ``--cpu-devices``, ``--data-dir``, ``--runs-dir``,
``--tpu-metrics``, ``--telemetry-interval``) are accepted before or after the
subcommand, and each also comes from a TPUDASH_* variable.
``run`` and ``watch`` record telemetry with the run while it is live.
Exit codes: 0 done, 1 job failed, 2 bad input (also: no terminal for the
dashboard, a runs directory that does not exist for ``runs``), 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence

from jobs.base import BOOL_SPELLINGS
from tpudash import __version__

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_CANCELLED = 130
EXIT_BY_STATUS = {"done": EXIT_DONE, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}
GLOBAL_FLAGS = ("tpu", "cpu_devices", "data_dir", "runs_dir", "tpu_metrics", "telemetry_interval")
# The dashboard's own: how long its engine may idle, how long a cancel may take.
DASHBOARD_FLAGS = ("release_after", "cancel_grace")
PATH_FLAGS = ("data_dir", "runs_dir")
# What each subcommand does: its help in `tpudash --help`, and the list shown
# when the dashboard has no terminal.
COMMANDS = {
    "devices": ("tpudash devices", "detect the accelerator and describe its devices"),
    "jobs": ("tpudash jobs", "list the jobs and their params"),
    "run": ("tpudash run JOB", "run a job headless (tpudash run JOB --help: its params)"),
    "runs": ("tpudash runs", "list recorded runs"),
    "watch": ("tpudash watch [RUN]", "follow a run as it grows (default: the newest live run)"),
    "telemetry": ("tpudash telemetry", "TPU duty cycle and HBM, host CPU and memory, every interval"),
    "export": ("tpudash export RUN", "export a run's metrics and telemetry"),
    "serve": ("tpudash serve", "the dashboard in a web browser (one dashboard per tab)"),
}
# Set in every Colab runtime (CPU, GPU and TPU): cheap to read, no import needed.
COLAB_VARIABLES = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_TPU_ADDR")


class BadInput(Exception):
    """Anything the user typed that cannot be used; exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same prefix, exit 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"tpudash: error: {message}\n")


def _global_flags() -> argparse.ArgumentParser:
    # SUPPRESS keeps a flag given before the subcommand from being reset by the
    # subparser's default, so `tpudash --cpu-devices 4 run …` and
    # `tpudash run … --cpu-devices 4` mean the same.
    flags = argparse.ArgumentParser(add_help=False)
    group = flags.add_argument_group("session (also from TPUDASH_* variables)")
    group.add_argument("--tpu", default=argparse.SUPPRESS, metavar="NAME|grpc://HOST:PORT|local|none",
                       help="connect to this TPU; failure is an error, never a fallback; "
                            "none: leave the TPU alone, run on the CPU default [TPUDASH_TPU]")
    group.add_argument("--cpu-devices", default=argparse.SUPPRESS, metavar="N",
                       help="logical CPU devices when no accelerator is found (default 8) [TPUDASH_CPU_DEVICES]")
    group.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR",
                       help="tensorflow-datasets data directory [TPUDASH_DATA_DIR]")
    group.add_argument("--runs-dir", default=argparse.SUPPRESS, metavar="DIR",
                       help="where runs are kept (default $XDG_DATA_HOME/tpudash/runs) [TPUDASH_RUNS_DIR]")
    group.add_argument("--tpu-metrics", default=argparse.SUPPRESS, metavar="HOST:PORT",
                       help="libtpu's metrics service on this host, read for TPU telemetry "
                            "(default localhost:8431) [TPUDASH_TPU_METRICS]")
    group.add_argument("--telemetry-interval", default=argparse.SUPPRESS, metavar="SECONDS",
                       help="seconds between telemetry samples; 0 turns sampling off (default 1) "
                            "[TPUDASH_TELEMETRY_INTERVAL]")
    return flags


def build_parser() -> argparse.ArgumentParser:
    flags = _global_flags()
    parser = _Parser(
        prog="tpudash",
        description="Terminal dashboard for TensorFlow accelerator sessions. Without a command, starts the TUI.",
        parents=[flags],
    )
    parser.add_argument("--version", action="version", version=f"tpudash {__version__}")
    dashboard = parser.add_argument_group("dashboard (without a command; also from TPUDASH_* variables)")
    dashboard.add_argument("--release-after", metavar="SECONDS",
                           help="release the accelerator (the engine exits) after this long idle; "
                                "0 keeps it until quit or E (default 0) [TPUDASH_RELEASE_AFTER]")
    dashboard.add_argument("--cancel-grace", metavar="SECONDS",
                           help="how long a cancelled job may take to stop before its engine is ended "
                                "(default 2) [TPUDASH_CANCEL_GRACE]")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    devices = commands.add_parser("devices", parents=[flags], help=COMMANDS["devices"][1])
    devices.add_argument("--json", action="store_true", help="print the description as JSON")

    jobs = commands.add_parser("jobs", parents=[flags], help=COMMANDS["jobs"][1])
    jobs.add_argument("--json", action="store_true", help="print the job list as JSON")

    # Its own --help: with a job named, the help lists that job's params.
    run = commands.add_parser("run", parents=[flags], help=COMMANDS["run"][1], add_help=False,
                              description="Run a job headless. `tpudash run JOB --help` lists the job's params "
                                          "(name, default, what is allowed); `tpudash jobs` lists every job.",
                              epilog=f"Booleans: {BOOL_SPELLINGS}.")
    run.add_argument("-h", "--help", action="store_true", help="show this help, and the params of JOB if given")
    run.add_argument("job", nargs="?", help="job name, e.g. matmul, gradient-descent, train")
    run.add_argument("--set", dest="assignments", action="append", default=[], metavar="NAME=VALUE",
                     help="set a param (repeatable)")
    run.add_argument("--json", action="store_true", help="print one JSON event per line instead of the live display")
    run.set_defaults(run_parser=run)  # for its usage line in errors and help

    runs = commands.add_parser(
        "runs", parents=[flags], help=COMMANDS["runs"][1],
        description="List the runs in the runs directory (--runs-dir, else TPUDASH_RUNS_DIR, else "
                    "$XDG_DATA_HOME/tpudash/runs). A directory that does not exist is an error (exit 2); "
                    "an empty one lists nothing (exit 0).")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON")

    watch = commands.add_parser(
        "watch", parents=[flags], help=COMMANDS["watch"][1],
        description="Follow a run headless, printed as `tpudash run` prints it: a tpudash job, or your own "
                    "training with TpudashCallback or tpudash.record. Exits when the run ends, with the exit "
                    "code of its status (done 0, failed 1, cancelled 130; interrupted, when the process "
                    "writing it dies, 1).")
    watch.add_argument("run_id", nargs="?", metavar="RUN",
                       help="run id (a unique prefix is enough); default: the newest live run")
    watch.add_argument("--json", action="store_true", help="print one JSON event per line instead of the live display")

    telemetry = commands.add_parser(
        "telemetry", parents=[flags], help=COMMANDS["telemetry"][1],
        description="Sample the TPU (libtpu's metrics service, through tpu-info's client) and the host (psutil) "
                    "without touching TensorFlow, so it also sees a TPU another process holds. Until Ctrl-C, "
                    "or once with --once. A source that answers nothing says why.")
    telemetry.add_argument("--once", action="store_true", help="take one sample, print it and exit")
    telemetry.add_argument("--json", action="store_true", help="print each sample as one JSON object per line")

    serve = commands.add_parser(
        "serve", parents=[flags], help=COMMANDS["serve"][1],
        description="Serve the dashboard to web browsers through textual-serve: every browser tab runs its own "
                    "dashboard with these settings. Listens on 127.0.0.1 unless told otherwise; remote machines: "
                    "ssh -L 8000:localhost:8000 HOST. Ctrl-C stops the server and every dashboard it started.")
    serve.add_argument("--host", metavar="ADDRESS",
                       help="address to listen on (default 127.0.0.1); one that is not loopback also needs --public")
    serve.add_argument("--port", metavar="PORT", help="port to listen on (default 8000; 0: any free port)")
    serve.add_argument("--public", action="store_true",
                       help="allow listening beyond loopback (alone: every interface); anyone who reaches the "
                            "port can launch jobs on this machine")
    serve.add_argument("--allow-any-host-header", action="store_true",
                       help="behind a proxy that rewrites the Host header (Colab's): accept any; otherwise a "
                            "loopback server answers only to localhost names, against DNS rebinding")

    export = commands.add_parser("export", parents=[flags], help=COMMANDS["export"][1])
    export.add_argument("run_id", metavar="RUN", help="run id (a unique prefix is enough)")
    export.add_argument("--format", choices=("csv", "json"), default="csv", help="output format (default csv)")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")
    return parser


def load_settings(args: argparse.Namespace):
    from tpudash.config import Settings, SettingsError

    flags = {name: getattr(args, name, None) for name in GLOBAL_FLAGS + DASHBOARD_FLAGS}
    for name in PATH_FLAGS:
        # An empty path would silently mean the current directory
        # (`--runs-dir "$UNSET_VARIABLE"`), so it is refused.
        if flags[name] is not None and not str(flags[name]).strip():
            raise BadInput(f"--{name.replace('_', '-')}: is empty; allowed: a directory path")
    try:
        return Settings.load(flags)
    except SettingsError as error:
        raise BadInput(str(error)) from None


def readable_runs_dir(settings) -> Path:
    """The runs directory for listing and export: missing is fine (no runs yet), a file is not."""
    runs_dir = Path(settings.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise BadInput(f"--runs-dir / TPUDASH_RUNS_DIR: {runs_dir} is not a directory")
    return runs_dir


def main(argv: Sequence[str] | None = None) -> int:
    """``argv`` None: the real command line (this process may then start over on the CPU default)."""
    global _restartable
    _restartable = argv is None
    args = build_parser().parse_args(argv)
    if args.command is None:
        # Before anything heavy is imported: without a terminal the dashboard
        # would only write escape codes into a file or a pipe. A dashboard
        # served to a browser tab talks through pipes by design.
        from tpudash.web.serve import is_served

        not_terminals = [] if is_served() else streams_not_terminals()
        if not_terminals:
            print(no_terminal_message(not_terminals, on_colab(os.environ)), file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        settings = load_settings(args)
        if args.command is None:
            return command_tui(settings)
        handler = {
            "devices": command_devices,
            "jobs": command_jobs,
            "run": command_run,
            "runs": command_runs,
            "export": command_export,
            "watch": command_watch,
            "telemetry": command_telemetry,
            "serve": command_serve,
        }[args.command]
        return handler(args, settings)
    except BadInput as error:
        print(f"tpudash: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tpudash: interrupted", file=sys.stderr)
        return EXIT_CANCELLED
    finally:
        _release_native_stderr()


def streams_not_terminals() -> list[str]:
    """Which of standard input, output and error are not a terminal.

    The dashboard reads keys from standard input and draws on standard error
    (Textual's choice); standard output not being a terminal means the user
    asked for text they can pipe, which the headless commands give.
    """
    names = []
    streams = (("standard input", sys.stdin), ("standard output", sys.stdout), ("standard error", sys.stderr))
    for name, stream in streams:
        try:
            terminal = stream is not None and stream.isatty()
        except (AttributeError, OSError, ValueError):  # closed, or not a real file
            terminal = False
        if not terminal:
            names.append(name)
    return names


def on_colab(environ: Mapping[str, str]) -> bool:
    return any(environ.get(variable) is not None for variable in COLAB_VARIABLES)


def no_terminal_message(not_terminals: Sequence[str], colab: bool) -> str:
    """Why the dashboard does not start, and what works instead."""
    what = not_terminals[-1] if len(not_terminals) == 1 else f"{', '.join(not_terminals[:-1])} and {not_terminals[-1]}"
    verb = "is" if len(not_terminals) == 1 else "are"
    width = max(len(usage) for usage, _ in COMMANDS.values())
    lines = [f"tpudash: error: the dashboard needs a terminal, and {what} {verb} not one "
             "(a pipe, a file or a notebook cell).",
             "These commands work without one:"]
    lines += [f"  {usage.ljust(width)}  {what_it_does}" for usage, what_it_does in COMMANDS.values()]
    if colab:
        lines.append("On Colab, open its terminal (the terminal icon at the bottom left, or Tools → Terminal) "
                     "and run tpudash there, or show the dashboard in a cell: "
                     "from tpudash import colab; colab.show()")
    return "\n".join(lines)


_native_stderr = None
_restartable = False


def _runtime(settings):
    """Detect the runtime with TensorFlow's native chatter sent to the session log."""
    global _native_stderr
    from tpudash.accel.nativelog import NativeStderr, session_log_path
    from tpudash.accel.runtime import get_runtime
    from tpudash.accel.startup import RuntimeSetupError, TpuFallback

    if _native_stderr is None and os.environ.get("TPUDASH_NATIVE_STDERR") != "terminal" and _stderr_is_fd2():
        _native_stderr = NativeStderr(session_log_path(settings.runs_dir)).start()
    try:
        return get_runtime(settings)
    except TpuFallback as fallback:
        _start_over_on_cpu(fallback.reason)
        raise BadInput(f"{fallback.reason}; run again with --tpu none for the CPU default") from None
    except RuntimeSetupError as error:
        raise BadInput(str(error)) from None


def _start_over_on_cpu(reason: str) -> None:
    """Replace this process with the same command on the CPU default.

    The failed TPU attempt has started TensorFlow (and may still be stuck in
    libtpu), so this process can no longer split the CPU; nothing has run yet,
    so starting over loses nothing. Only for the real command line.
    """
    from tpudash.accel.runtime import FALLBACK_REASON_VARIABLE, NO_TPU

    if not _restartable:
        return
    print(f"tpudash: {reason}; starting over on the CPU default (--tpu none)", file=sys.stderr)
    _release_native_stderr()
    sys.stdout.flush()
    sys.stderr.flush()
    environment = dict(os.environ, TPUDASH_TPU=NO_TPU, **{FALLBACK_REASON_VARIABLE: reason})
    os.execve(sys.executable, [sys.executable, "-m", "tpudash", *sys.argv[1:]], environment)


def _stderr_is_fd2() -> bool:
    """Only a real process stderr is worth protecting (not a test's capture)."""
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def _release_native_stderr() -> None:
    global _native_stderr
    if _native_stderr is not None:
        _native_stderr.stop()
        _native_stderr = None


def command_tui(settings) -> int:
    from tpudash.tui.app import run_app

    settings.check_runs_dir()
    return run_app(settings) or 0


def command_devices(args, settings) -> int:
    from tpudash.cli.render import render_devices, render_host

    try:
        runtime = _runtime(settings)
    except BadInput as error:
        # What the host scan found is worth showing even when TensorFlow
        # cannot start: it is where the fix comes from.
        _print_host(args.json, render_host, str(error))
        raise
    if args.json:
        print(json.dumps(runtime.description.to_dict(), indent=2))
    else:
        render_devices(runtime.description)
    return EXIT_DONE


def _print_host(as_json: bool, render_host, error: str) -> None:
    from tpudash.accel.hostcheck import inspect

    host = inspect().to_dict()
    if as_json:
        print(json.dumps({"error": error, "host_check": host}, indent=2))
    else:
        render_host(host)


def command_jobs(args, settings) -> int:
    from jobs import registry
    from tpudash.cli.render import render_jobs

    specs = list(registry().values())
    if args.json:
        print(json.dumps([spec.describe() for spec in specs], indent=2))
    else:
        render_jobs(specs)
    return EXIT_DONE


def command_run(args, settings) -> int:
    from jobs import UnknownJobError, get_job, registry
    from jobs.base import ParamError, did_you_mean, parse_assignments
    from tpudash.config import SettingsError

    if args.job is None and not args.help:
        args.run_parser.error("the following arguments are required: job")
    try:
        spec = None if args.job is None else get_job(args.job)
    except UnknownJobError as error:
        raise BadInput(f"{error}{did_you_mean(args.job, registry())}") from None
    if args.help:
        return show_run_help(args.run_parser, spec)
    try:
        params = spec.resolve(parse_assignments(args.assignments))
    except ParamError as error:
        raise BadInput(str(error)) from None
    try:
        runs_dir = settings.check_runs_dir()
    except SettingsError as error:
        raise BadInput(str(error)) from None
    runtime = _runtime(settings)
    if spec.check_runtime is not None:
        try:
            spec.check_runtime(params, runtime)
        except ParamError as error:
            raise BadInput(str(error)) from None
    return execute_headless(spec, params, runtime, settings, runs_dir, as_json=args.json)


def show_run_help(run_parser: argparse.ArgumentParser, spec) -> int:
    """``tpudash run [JOB] --help``: the command's help, then the job's params."""
    from rich.console import Console

    from jobs import registry
    from tpudash.cli.render import render_job

    run_parser.print_help()
    print()
    if spec is None:
        print(f"jobs: {', '.join(registry())}")
    else:
        render_job(spec, Console(highlight=False))
    return EXIT_DONE


def execute_headless(spec, params, runtime, settings, runs_dir: Path, as_json: bool) -> int:
    """Run on a job thread so Ctrl-C and SIGTERM become a clean, recorded cancel."""
    from tpudash.cli.render import ConsoleSink, JsonLinesSink
    from tpudash.runs.store import RunStore
    from tpudash.engine.runner import Runner
    from tpudash.telemetry.sampling import RecordingTelemetry

    def on_output_closed():
        # The reader of standard output went away (`tpudash run … | head`).
        print(f"tpudash: standard output was closed; cancelling {spec.name}", file=sys.stderr)
        runner.cancel(queued)

    sink = JsonLinesSink(sys.stdout, on_output_closed) if as_json else ConsoleSink(on_output_closed=on_output_closed)
    telemetry = RecordingTelemetry(settings, {"tpudash_run": os.getpid()})
    runner = Runner(lambda: runtime, RunStore(runs_dir), settings, sinks=[sink, telemetry])
    queued = runner.submit(spec, params)
    job_thread = threading.Thread(target=runner.execute, args=(queued,), name=f"tpudash-job-{spec.name}", daemon=True)
    interrupts = []

    def on_signal(signum, frame):
        interrupts.append(signum)
        if len(interrupts) == 1:
            sink.notice(f"cancelling {spec.name} (signal {signal.Signals(signum).name}); again to stop at once")
            runner.cancel(queued)
        else:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with telemetry:
            job_thread.start()
            while not queued.done_event.wait(0.2):
                pass
    except KeyboardInterrupt:
        # Second signal: the job ignores cancel; the record stays "running" and
        # reads as interrupted, with every event written so far.
        return EXIT_CANCELLED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sink.close()
    if queued.state == "failed" and _native_stderr is not None:
        print(f"tpudash: TensorFlow's native log for this session: {_native_stderr.log_path}", file=sys.stderr)
    return EXIT_BY_STATUS.get(queued.state, EXIT_FAILED)


def command_runs(args, settings) -> int:
    from tpudash.cli.render import render_runs
    from tpudash.runs.store import RunStore

    runs_dir = readable_runs_dir(settings)
    if not runs_dir.exists():
        raise BadInput(f"{runs_dir_source(args)}: {runs_dir} does not exist, so it holds no runs; "
                       "choose the runs directory with --runs-dir DIR or TPUDASH_RUNS_DIR "
                       "(default $XDG_DATA_HOME/tpudash/runs; a run creates it)")
    runs = RunStore(runs_dir).list_runs()
    if args.json:
        print(json.dumps([run.to_dict() for run in runs], indent=2, default=str))
    else:
        render_runs(runs, runs_dir)
    return EXIT_DONE


def runs_dir_source(args) -> str:
    """Where the runs directory came from, named as the user would set it."""
    if getattr(args, "runs_dir", None) is not None:
        return "--runs-dir"
    if os.environ.get("TPUDASH_RUNS_DIR"):
        return "TPUDASH_RUNS_DIR"
    return "the default runs directory"


def command_watch(args, settings) -> int:
    """Print a run's events as they are written; the exit code of how it ended."""
    from rich.text import Text

    from tpudash.cli.render import ConsoleSink, JsonLinesSink, status_text
    from tpudash.runs.follow import POLL_SECONDS, RunFollower, newest_live_run
    from tpudash.runs.store import STATUS_INTERRUPTED, STATUS_RUNNING, RunStore
    from tpudash.telemetry.sampling import RecordingTelemetry

    store = RunStore(readable_runs_dir(settings))
    run_id = args.run_id
    if run_id is None:
        newest = newest_live_run(store)
        if newest is None:
            raise BadInput(f"RUN: no run is live in {store.root}; name one (`tpudash runs` lists them), or start "
                           "your training with TpudashCallback first")
        run_id = newest.run_id
    try:
        follower = RunFollower(store, run_id)
    except KeyError as error:
        raise BadInput(f"RUN: {error.args[0]}") from None
    stop_watching = threading.Event()

    def on_output_closed():
        stop_watching.set()

    sink = JsonLinesSink(sys.stdout, on_output_closed) if args.json else ConsoleSink(on_output_closed=on_output_closed)
    telemetry = RecordingTelemetry(settings, {"writer": follower.info.pid} if follower.info.pid else {})
    # A run that has already ended gets no samples of a time it was not live.
    telemetry.run_dir = follower.run_dir if follower.info.status == STATUS_RUNNING else None
    try:
        with telemetry:
            while not stop_watching.is_set():
                for stamp, event in follower.poll():
                    sink(None, event, stamp)
                if follower.ended:
                    break
                stop_watching.wait(POLL_SECONDS)
    except KeyboardInterrupt:
        sink.notice(f"stopped watching {follower.info.run_id}; the run itself goes on")
        return EXIT_CANCELLED
    finally:
        sink.close()
    if stop_watching.is_set():
        return EXIT_CANCELLED
    model = follower.model
    if model.status == STATUS_INTERRUPTED:
        writer = f"pid {follower.info.pid}" if follower.info.pid is not None else "its process"
        if args.json:
            sink.notice(f"{follower.info.run_id}: {writer} ended without finishing the run: interrupted")
        else:  # the ending line `run` prints, with why
            sink.console.print(Text.assemble(status_text(STATUS_INTERRUPTED), f": {writer} ended without "
                                             f"finishing {follower.info.run_id}"))
    return EXIT_BY_STATUS.get(model.status, EXIT_FAILED)


# What ``--once`` measures CPU over (psutil compares two readings).
ONCE_CPU_WINDOW_SECONDS = 0.25


def command_telemetry(args, settings) -> int:
    """Print telemetry samples: one (``--once``), or one per interval until interrupted."""
    from rich.console import Console
    from rich.live import Live

    from jobs.events import dumps
    from tpudash.cli.render import silence_output, telemetry_view
    from tpudash.telemetry.sampling import SamplingLoop, telemetry_sampler

    if not settings.telemetry_interval and not args.once:
        raise BadInput("--telemetry-interval: 0 turns sampling off; allowed here: 0.1 to 60 seconds, or --once")
    sampler = telemetry_sampler(settings)
    if args.once:
        threading.Event().wait(ONCE_CPU_WINDOW_SECONDS)  # psutil's CPU figure is over this window
        stamp, sample = sampler.sample()
        sampler.close()
        if args.json:
            print(dumps(sample, stamp))
        else:
            Console().print(telemetry_view(sample, (), settings.tpu_metrics))
        return EXIT_DONE
    live = None if args.json else Live(console=Console(), auto_refresh=False)

    def show(stamp, sample):
        if live is None:
            print(dumps(sample, stamp), flush=True)
        else:
            past = [old for _, old in list(sampler.history)[:-1]]
            live.update(telemetry_view(sample, past, settings.tpu_metrics), refresh=True)

    try:
        if live is not None:
            live.start()
        SamplingLoop(sampler, settings.telemetry_interval, show).run()
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    except BrokenPipeError:
        silence_output(sys.stdout)  # `tpudash telemetry --json | head`: the reader has what it wanted
        return EXIT_DONE
    finally:
        if live is not None:
            live.stop()
    return EXIT_DONE


def command_export(args, settings) -> int:
    from tpudash.runs.store import RunStore

    store = RunStore(readable_runs_dir(settings))
    try:
        text = store.export(args.run_id, args.format)
    except KeyError as error:
        raise BadInput(error.args[0]) from None
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as error:
            raise BadInput(f"-o/--output: cannot write {args.output}: {error.strerror or error}") from None
        print(f"exported {args.run_id} to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_DONE


def command_serve(args, settings) -> int:
    """The dashboard in a web browser: tpudash/serve.py."""
    from tpudash.web.serve import command_serve as serve

    return serve(args, settings)


if __name__ == "__main__":
    raise SystemExit(main())
