"""The ``tpudash`` command line: its parser, the settings it gives, and which command runs.

``tpudash`` alone starts the TUI, in a terminal only: without one (a pipe, a
file, a notebook cell) it exits 2 at once and points to the headless commands.
``devices``, ``jobs``, ``run``, ``runs``, ``watch``, ``telemetry``,
``export`` and ``copy`` work headless for notebooks, scripts and CI; every
command that takes a runs directory also takes a store URL (gs://, s3://). Global flags
(``--tpu``, ``--cpu-devices``, ``--framework``, ``--data-dir``, ``--runs-dir``,
``--tpu-metrics``, ``--telemetry-interval``, and the dashboard's
``--release-after`` and ``--cancel-grace``) are accepted before or after
the subcommand, and each also comes from a TPUDASH_* variable.
``run`` and ``watch`` record telemetry with the run while it is live
(``watch``: only into a runs directory on this host).
Exit codes: 0 done, 1 job failed, 2 bad input (also: no terminal for the
dashboard, a runs directory that does not exist for ``runs``, a store URL
whose library is not installed), 130 cancelled; a store that does not
answer is one line and 1.
A reader that stops reading (``tpudash jobs | head``) ends any command
quietly with 0, as it ends any other Unix tool (``run`` and ``watch`` also
stop their run or their watching then).

This module is the dispatch: parse, check for a terminal, load the
settings, run one command, and turn what it raises into an exit code. Its
parts: ``tpudash.cli.parser`` (the parser and every command's help),
``tpudash.cli.terminal`` (the terminal check and its message),
``tpudash.cli.ending`` (leaving at once, or quietly when the reader went
away), ``tpudash.cli.exits`` (the codes); the commands themselves are
``tpudash.cli.commands``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpudash.cli import advising, commands, copying, hosts, profiling
from tpudash.cli.ending import leave_now, reader_went_away
from tpudash.cli.exits import EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_FAILED, BadInput
from tpudash.cli.parser import COMMANDS, DASHBOARD_FLAGS, FLAGS_USED, GLOBAL_FLAGS, RUNS_DIR_FLAGS, build_parser
from tpudash.cli.terminal import COLAB_VARIABLES, no_terminal_message, on_colab, streams_not_terminals
from tpudash.cli.typos import nearest_names, typos_between
from tpudash.runs.storeclient import set_store_timeout

if TYPE_CHECKING:
    from tpudash.config import Settings

__all__ = [  # the dispatch's, and what callers and tests import from here
    "COLAB_VARIABLES",
    "COMMANDS",
    "DASHBOARD_FLAGS",
    "FLAGS_USED",
    "GLOBAL_FLAGS",
    "PATH_FLAGS",
    "RUNS_DIR_FLAGS",
    "build_parser",
    "leave_now",
    "load_settings",
    "main",
    "nearest_names",
    "no_terminal_message",
    "on_colab",
    "streams_not_terminals",
    "typos_between",
]

PATH_FLAGS = ("data_dir", "runs_dir")


def load_settings(args: argparse.Namespace) -> Settings:
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


def main(argv: Sequence[str] | None = None) -> int:
    """``argv`` None: the real command line (this process may then start over on the CPU default)."""
    try:
        return _parse_and_dispatch(argv)
    except BrokenPipeError:
        return reader_went_away()
    except SystemExit as exiting:
        # rich's consoles end the process with 1 when standard output is
        # closed (``Console.on_broken_pipe``), raised while handling the
        # BrokenPipeError: that is the same reader going away.
        if isinstance(exiting.__context__, BrokenPipeError):
            return reader_went_away()
        raise


def _parse_and_dispatch(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    # Only the real command line may be started over (``tpudash.engine.headless``).
    args.restartable = argv is None
    if args.command is None:
        # Before anything heavy is imported: without a terminal the dashboard
        # would only write escape codes into a file or a pipe. A dashboard
        # served to a browser tab talks through pipes by design.
        from tpudash.web.tabs import is_served

        not_terminals = [] if is_served() else streams_not_terminals()
        if not_terminals:
            print(no_terminal_message(not_terminals, on_colab(os.environ)), file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        settings = load_settings(args)
        set_store_timeout(settings.store_timeout)  # every store call of this process waits this long at most
        if args.command is None:
            code = commands.command_tui(settings)
            if args.restartable:
                leave_now(code)
            return code
        handler = {
            "devices": commands.command_devices,
            "jobs": commands.command_jobs,
            "run": commands.command_run,
            "runs": commands.command_runs,
            "export": commands.command_export,
            "watch": commands.command_watch,
            "telemetry": commands.command_telemetry,
            "serve": commands.command_serve,
            "copy": copying.command_copy,
            "profile": profiling.command_profile,
            "advise": advising.command_advise,
            "hosts": hosts.command_hosts,
            "agent": hosts.command_agent,
        }[args.command]
        return handler(args, settings)
    except BadInput as error:
        print(f"tpudash: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except commands.StoreUnreachable as error:
        print(f"tpudash: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("tpudash: interrupted", file=sys.stderr)
        return EXIT_CANCELLED


if __name__ == "__main__":
    raise SystemExit(main())
