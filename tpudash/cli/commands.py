"""The ``tpudash`` subcommands: each ``command_<name>(args, settings)`` returns its exit code.

``tpudash.cli.main`` parses the command line and calls one of these. They
print through ``tpudash.cli.render`` and the run sinks (``tpudash.cli.sinks``),
raise ``BadInput`` for what cannot be used (exit 2), and reach TensorFlow only
through ``tpudash.engine.headless`` (``run`` and ``devices`` detect the
runtime in this process). Everything heavy is imported inside the command
that needs it, so ``tpudash --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from tpudash.cli.exits import EXIT_BY_STATUS, EXIT_CANCELLED, EXIT_DONE, EXIT_FAILED, BadInput

if TYPE_CHECKING:
    from jobs.base import JobSpec
    from jobs.events import Telemetry
    from tpudash.accel.description import Runtime
    from tpudash.cli.sinks import ConsoleSink, JsonLinesSink
    from tpudash.config import Settings
    from tpudash.runs.follow import RunFollower, StoreAway

# What ``--once`` measures CPU over (psutil compares two readings).
ONCE_CPU_WINDOW_SECONDS = 0.25


def readable_runs_dir(settings: Settings) -> Path | str:
    """The runs directory for listing, watching and export: missing is fine (no runs yet), a file is not.

    A store URL is returned as it is, once the library that reads it is
    importable (else BadInput with the one line that installs it).
    """
    from tpudash.config import default_runs_dir

    runs_dir = settings.runs_dir or default_runs_dir(os.environ)
    if isinstance(runs_dir, str):
        return checked_store(runs_dir, "--runs-dir / TPUDASH_RUNS_DIR")
    runs_dir = Path(runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise BadInput(f"--runs-dir / TPUDASH_RUNS_DIR: {runs_dir} is not a directory")
    return runs_dir


def checked_store(url: str, named: str) -> str:
    """``url`` when its filesystem library is installed; else BadInput naming ``named`` and the install line."""
    from tpudash.runs.location import missing_library

    missing = missing_library(url)
    if missing is not None:
        raise BadInput(f"{named}: {missing}")
    return url


class StoreUnreachable(Exception):
    """A store that did not answer (or refused): one line, exit 1, no traceback (``tpudash.cli.main``)."""


@contextmanager
def reaching(runs_dir: Path | str, doing: str = "") -> Iterator[None]:
    """Turn what a store's client raises into ``StoreUnreachable``: one line naming the store, not a traceback.

    The line names the URL, what the store is (GCS, an emulator and its
    address, S3) and why (``storeclient.failure_line``); every call waited
    at most ``--store-timeout``. A bucket that does not exist is bad input
    (exit 2), as a runs directory that does not exist is. A local runs
    directory is left alone: its errors are this host's, and the commands
    say them as before. ``doing``: what was under way, said after.
    """
    from tpudash.runs.location import MissingBucket, is_store_url
    from tpudash.runs.storeclient import failure_line

    if not is_store_url(runs_dir):
        yield
        return
    try:
        yield
    except (BadInput, StoreUnreachable, BrokenPipeError):
        raise
    except MissingBucket as error:
        raise BadInput(str(error)) from None
    except Exception as error:  # noqa: BLE001 - each store's client (aiohttp, botocore, …) raises its own types
        # A call names its own store (``copy`` reaches two); else the one this block reaches.
        url = getattr(error, "store_url", None) or str(runs_dir)
        raise StoreUnreachable(f"{failure_line(url, error)}{doing}") from None


def one_line(error: BaseException, limit: int = 300) -> str:
    """An error as one line a user reads: its type and its text, cut at ``limit`` characters."""
    from tpudash.runs.storeclient import one_line as error_line

    return error_line(error, limit)


def runs_dir_source(args: argparse.Namespace) -> str:
    """Where the runs directory came from, named as the user would set it."""
    if getattr(args, "runs_dir", None) is not None:
        return "--runs-dir"
    if os.environ.get("TPUDASH_RUNS_DIR"):
        return "TPUDASH_RUNS_DIR"
    return "the default runs directory"


@contextmanager
def runtime_in_this_process(args: argparse.Namespace, settings: Settings) -> Iterator[Runtime]:
    """The runtime detected in this process (``tpudash.engine.headless``), TensorFlow's native log taken meanwhile.

    A runtime that cannot start is bad input. Only the real command line
    (``args.restartable``) may start this process over on the CPU default.
    """
    from tpudash.engine.headless import RuntimeUnavailable, detect_runtime, release_native_stderr

    try:
        try:
            runtime = detect_runtime(settings, restartable=getattr(args, "restartable", False))
        except RuntimeUnavailable as error:
            raise BadInput(str(error)) from None
        yield runtime
    finally:
        release_native_stderr()


def command_tui(settings: Settings) -> int:
    from tpudash.tui.app import run_app

    settings.check_runs_dir()
    return run_app(settings) or 0


def command_devices(args: argparse.Namespace, settings: Settings) -> int:
    from tpudash.cli.render import render_devices

    try:
        with runtime_in_this_process(args, settings) as runtime:
            if args.json:
                print(json.dumps(runtime.description.to_dict(), indent=2))
            else:
                render_devices(runtime.description)
    except BadInput as error:
        # What the host scan found is worth showing even when TensorFlow
        # cannot start: it is where the fix comes from.
        _print_host(args.json, str(error))
        raise
    return EXIT_DONE


def _print_host(as_json: bool, error: str) -> None:
    from tpudash.accel.hostcheck import inspect
    from tpudash.cli.render import render_host

    host = inspect().to_dict()
    if as_json:
        print(json.dumps({"error": error, "host_check": host}, indent=2))
    else:
        render_host(host)


def command_jobs(args: argparse.Namespace, settings: Settings) -> int:
    from jobs import registry
    from tpudash.cli.render import render_jobs

    specs = list(registry().values())
    if args.json:
        print(json.dumps([spec.describe() for spec in specs], indent=2))
    else:
        render_jobs(specs)
    return EXIT_DONE


def command_run(args: argparse.Namespace, settings: Settings) -> int:
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
    assert spec is not None  # a job is named unless --help was asked for
    checked_framework(spec, settings)
    try:
        assignments = parse_assignments(args.assignments)
    except ParamError as error:
        raise BadInput(str(error)) from None
    if args.profile_steps is not None:
        from tpudash.cli.profilesteps import with_profile_steps

        assignments = with_profile_steps(spec, assignments, args.profile_steps)
    from tpudash.cli.workerflags import checked_run_id, join_cluster, requested_workers

    # TF_CONFIG is this process's before anything loads TensorFlow, which reads it once.
    worker_count = join_cluster(args)
    from tpudash.runs.workers import find_worker

    try:
        worker = find_worker()
    except ValueError as error:
        raise BadInput(f"TF_CONFIG: {error}") from None
    workers = requested_workers(args, spec, assignments, worker.count if worker is not None else worker_count)
    try:
        params = spec.resolve(assignments)
    except ParamError as error:
        raise BadInput(str(error)) from None
    name = checked_run_name(args.name)
    run_id = checked_run_id(args.run_id)
    try:
        runs_dir = settings.check_runs_dir()
    except SettingsError as error:
        raise BadInput(str(error)) from None
    if worker is None and workers > 1:
        # The workers detect the runtime, each in its own process; this one only starts and watches them.
        return execute_headless(spec, params, None, settings, runs_dir, as_json=args.json, name=name, run_id=run_id)
    with runtime_in_this_process(args, settings) as runtime:
        if spec.check_runtime is not None:
            try:
                spec.check_runtime(params, runtime)
            except ParamError as error:
                raise BadInput(str(error)) from None
        return execute_headless(spec, params, runtime, settings, runs_dir, as_json=args.json, name=name, run_id=run_id)


def checked_framework(spec: JobSpec, settings: Settings) -> None:
    """BadInput when ``spec`` has no runner on the framework the settings resolve to (nothing is started for it)."""
    from jobs.base import FrameworkNotSupported
    from tpudash.config import resolve_framework

    framework = resolve_framework(settings.framework)
    if framework not in spec.frameworks():
        error = FrameworkNotSupported(spec.name, framework, spec.not_on_jax if framework == "jax" else "")
        raise BadInput(f"{error} (--framework tensorflow runs it where TensorFlow is installed)")


def checked_run_name(name: str | None) -> str | None:
    """``--name`` as run.json will hold it, or BadInput naming the flag and what it may be."""
    from jobs.events import MAX_NAME_CHARS

    if name is None:
        return None
    stripped = name.strip()
    if not stripped or len(stripped) > MAX_NAME_CHARS or not stripped.isprintable():
        raise BadInput(
            f"--name must be text of 1 to {MAX_NAME_CHARS} printable characters (no tabs or newlines), not {name!r:.60}"
        )
    return stripped


def show_run_help(run_parser: argparse.ArgumentParser, spec: JobSpec | None) -> int:
    """``tpudash run [JOB] --help``: the command's help, then the job's params."""
    from jobs import registry
    from tpudash.cli.render import output_console, render_job

    run_parser.print_help()
    print()
    if spec is None:
        print(f"jobs: {', '.join(registry())}")
    else:
        render_job(spec, output_console(highlight=False))
    return EXIT_DONE


def execute_headless(
    spec: JobSpec,
    params: dict,
    runtime: Runtime | None,
    settings: Settings,
    runs_dir: Path | str,
    as_json: bool,
    name: str | None = None,
    run_id: str | None = None,
) -> int:
    """Run on a job thread so Ctrl-C and SIGTERM become a clean, recorded cancel.

    ``runtime`` None: the run is launched on workers (``tpudash.engine.cluster``), which detect their own.
    ``run_id``: record into this run (``--run-id``); None: a new one.
    """
    from tpudash.cli.sinks import ConsoleSink, JsonLinesSink
    from tpudash.engine.headless import InProcessJob, native_log_path
    from tpudash.telemetry.recorder import RecordingTelemetry

    def on_output_closed() -> None:
        # The reader of standard output went away (`tpudash run … | head`).
        print(f"tpudash: standard output was closed; cancelling {spec.name}", file=sys.stderr)
        job.cancel()

    sink = JsonLinesSink(sys.stdout, on_output_closed) if as_json else ConsoleSink(on_output_closed=on_output_closed)
    from tpudash.runs.store import RunStore

    telemetry = RecordingTelemetry(settings, {"tpudash_run": os.getpid()}, store=RunStore(runs_dir))
    job = InProcessJob(spec, params, runtime, settings, runs_dir, sinks=[sink, telemetry], name=name, run_id=run_id)
    interrupts = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        interrupts.append(signum)
        if len(interrupts) == 1:
            sink.notice(f"cancelling {spec.name} (signal {signal.Signals(signum).name}); again to stop at once")
            job.cancel()
        else:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with telemetry:
            job.start()
            while not job.wait(0.2):
                pass
    except KeyboardInterrupt:
        # Second signal: the job ignores cancel; the record stays "running" and
        # reads as interrupted, with every event written so far.
        return EXIT_CANCELLED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sink.close()
    if job.write_error is not None:
        # A full disk: the one thing to say, on one line (the console has the run's own end).
        print(f"tpudash: cannot write run {job.run_id} in {runs_dir}: {job.write_error}", file=sys.stderr)
        return EXIT_FAILED
    log_path = native_log_path()
    if job.state == "failed" and log_path is not None:
        print(f"tpudash: TensorFlow's native log for this session: {log_path}", file=sys.stderr)
    return EXIT_BY_STATUS.get(job.state, EXIT_FAILED)


def command_runs(args: argparse.Namespace, settings: Settings) -> int:
    from tpudash.cli.render import newest_first, render_runs
    from tpudash.runs.store import RunStore

    runs_dir = readable_runs_dir(settings)
    if isinstance(runs_dir, Path) and not runs_dir.exists():
        raise BadInput(
            f"{runs_dir_source(args)}: {runs_dir} does not exist, so it holds no runs; "
            "choose the runs directory with --runs-dir DIR or TPUDASH_RUNS_DIR "
            "(default $XDG_DATA_HOME/tpudash/runs; a run creates it)"
        )
    with reaching(runs_dir):
        runs = newest_first(RunStore(runs_dir).list_runs())  # as History lists them, and so does --json
    if args.json:
        print(json.dumps([run.to_dict() for run in runs], indent=2, default=str))
    else:
        render_runs(runs, runs_dir)
    return EXIT_DONE


def command_watch(args: argparse.Namespace, settings: Settings) -> int:
    """Print a run's events as they are written; the exit code of how it ended."""
    from tpudash.cli.sinks import ConsoleSink, JsonLinesSink
    from tpudash.runs.follow import RunFollower, StoreAway, newest_live_run
    from tpudash.runs.store import RunStore

    runs_dir = readable_runs_dir(settings)
    with reaching(runs_dir):
        store = RunStore(runs_dir)
        run_id = args.run_id
        if run_id is None:
            newest = newest_live_run(store)
            if newest is None:
                raise BadInput(
                    f"RUN: no run is live in {store.where}; name one (`tpudash runs` lists them), or start "
                    "your training with TpudashCallback first"
                )
            run_id = newest.run_id
        try:
            follower = RunFollower(store, run_id)
        except KeyError as error:
            raise BadInput(f"RUN: {error.args[0]}") from None
    stop_watching = threading.Event()

    def on_output_closed() -> None:
        stop_watching.set()

    store_away = StoreAway(follower)
    sink: JsonLinesSink | ConsoleSink
    if args.json:
        sink = JsonLinesSink(sys.stdout, on_output_closed)
    else:  # the bars' clocks stand still while the run's store is away: nothing is known of the time since
        sink = ConsoleSink(on_output_closed=on_output_closed, clock=store_away.time)
    with reaching(runs_dir, f"; stopped watching {follower.info.run_id}"):
        code = _follow(follower, sink, settings, stop_watching, store_away)
    if code is not None:
        return code
    _say_how_it_ended(follower, sink)
    return EXIT_BY_STATUS.get(follower.model.status, EXIT_FAILED)


def _follow(
    follower: RunFollower,
    sink: JsonLinesSink | ConsoleSink,
    settings: Settings,
    stop: threading.Event,
    store_away: StoreAway,
) -> int | None:
    """Print the run's events until it ends (None), or the exit code when the watching stopped first."""
    from tpudash.runs.follow import POLL_SECONDS
    from tpudash.runs.store import STATUS_RUNNING
    from tpudash.telemetry.recorder import RecordingTelemetry

    # What this host samples belongs to a run of this host only: another host's run gets none of it, and its
    # pid names no process here (a shared runs directory holds the runs of many hosts).
    of_this_host = follower.info.host is not None and follower.info.host == socket.gethostname()
    writer_pid = follower.info.pid if of_this_host else None
    telemetry = RecordingTelemetry(settings, {"writer": writer_pid} if writer_pid else {})
    # A run that has already ended gets no samples of a time it was not live; a run in a store gets none
    # from here (its telemetry is kept only with the runs this session writes itself).
    live_here = follower.info.status == STATUS_RUNNING and follower.store.local and of_this_host
    telemetry.run_dir = follower.run_dir if live_here and isinstance(follower.run_dir, Path) else None
    try:
        with telemetry:
            while not stop.is_set():
                said = store_away.update()  # where the user looks: just above the bars that stopped
                if said is not None:
                    sink.notice(said)
                for stamp, event in follower.poll():
                    sink(None, event, stamp)
                workers = follower.workers_update()  # a cluster's workers, read every few seconds
                if workers is not None:
                    sink.show_workers(workers)
                if follower.ended:
                    break
                stop.wait(POLL_SECONDS)
    except KeyboardInterrupt:
        sink.notice(f"stopped watching {follower.info.run_id}; the run itself goes on")
        return EXIT_CANCELLED
    finally:
        sink.close()
    return EXIT_CANCELLED if stop.is_set() else None


def _say_how_it_ended(follower: RunFollower, sink: JsonLinesSink | ConsoleSink) -> None:
    """A run that ended without its finish: why, as the ending line `run` prints (interrupted, or stale in a store)."""
    from rich.text import Text

    from tpudash.cli.sinks import JsonLinesSink
    from tpudash.format import status_text
    from tpudash.runs.liveness import HEARTBEAT_INTERVAL_SECONDS, STALE_AFTER_INTERVALS
    from tpudash.runs.store import STATUS_INTERRUPTED, STATUS_STALE

    status, run_id = follower.model.status, follower.info.run_id
    if status == STATUS_INTERRUPTED:
        writer = f"pid {follower.info.pid}" if follower.info.pid is not None else "its process"
        short = f"{writer} ended without finishing the run"
        why = f"{writer} ended without finishing {run_id}"
    elif status == STATUS_STALE:
        limit = STALE_AFTER_INTERVALS * HEARTBEAT_INTERVAL_SECONDS
        short = f"no heartbeat from its writer in {limit:g} s and no finish (dead, or cut off from the store)"
        why = f"no heartbeat from the writer of {run_id} in {limit:g} s and no finish (dead, or cut off from the store)"
    else:
        return
    if isinstance(sink, JsonLinesSink):
        sink.notice(f"{run_id}: {short}: {status}")
    else:
        sink.console.print(Text.assemble(status_text(status), f": {why}"))


def command_telemetry(args: argparse.Namespace, settings: Settings) -> int:
    """Print telemetry samples: one (``--once``), or one per interval until interrupted."""
    from rich.console import Console
    from rich.live import Live

    from jobs.events import dumps
    from tpudash.cli.render import output_console
    from tpudash.format import telemetry_view
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
            output_console().print(telemetry_view(sample, (), settings.tpu_metrics))
        return EXIT_DONE
    live = None if args.json else Live(console=Console(), auto_refresh=False)

    def show(stamp: float, sample: Telemetry) -> None:
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
    finally:
        if live is not None:
            live.stop()
    return EXIT_DONE


def command_export(args: argparse.Namespace, settings: Settings) -> int:
    from tpudash.runs.export_stream import write_run_csv
    from tpudash.runs.store import RunStore

    runs_dir = readable_runs_dir(settings)
    with reaching(runs_dir):
        store = RunStore(runs_dir)
        try:
            store.find(args.run_id)  # no such run: said before the output is opened
        except KeyError as error:
            raise BadInput(error.args[0]) from None

        def write(out: IO[str]) -> None:
            # CSV is written as the run is read, in bounded memory (a run of a million events); JSON is one document.
            if args.format == "csv":
                write_run_csv(store, args.run_id, out)
            else:
                out.write(store.export(args.run_id, args.format))

        if not args.output:
            write(sys.stdout)
            return EXIT_DONE
        try:
            with Path(args.output).open("w", encoding="utf-8") as out:
                write(out)
        except OSError as error:
            raise BadInput(f"-o/--output: cannot write {args.output}: {error.strerror or error}") from None
    print(f"exported {args.run_id} to {args.output}", file=sys.stderr)
    return EXIT_DONE


def command_serve(args: argparse.Namespace, settings: Settings) -> int:
    """The dashboard in a web browser (``tpudash.web.serve``); what it cannot use is bad input."""
    from tpudash.config import SettingsError
    from tpudash.web.serve import ServeError, serve_dashboards

    try:
        return serve_dashboards(args, settings)
    except (ServeError, SettingsError) as error:
        raise BadInput(str(error)) from None
