"""The ``tpudash`` command line's parser: every command, its flags and its help.

``build_parser()`` makes it. The global flags (``GLOBAL_FLAGS``, and the
dashboard's ``DASHBOARD_FLAGS``) are accepted before or after the
subcommand; each command's help lists only those it uses (``FLAGS_USED``).
argparse's own errors exit 2 with tpudash's prefix, and a mistyped command
is told the nearest ones (``tpudash.cli.typos``). Which command then runs
is ``tpudash.cli.main``'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from tpudash.cli import advising, hosts, profiling
from tpudash.cli.exits import EXIT_BAD_INPUT
from tpudash.cli.typos import nearest_names
from tpudash.version import __version__

GLOBAL_FLAGS = (
    "tpu",
    "cpu_devices",
    "framework",
    "data_dir",
    "runs_dir",
    "tpu_metrics",
    "telemetry_interval",
    "store_timeout",
)
# The dashboard's own: how long its engine may idle, how long a cancel may take.
DASHBOARD_FLAGS = ("release_after", "cancel_grace")
# What each subcommand does: its help in `tpudash --help`, and the list shown
# when the dashboard has no terminal.
COMMANDS = {
    "devices": ("tpudash devices", "detect the accelerator and describe its devices"),
    "jobs": ("tpudash jobs", "list the jobs and their params"),
    "run": ("tpudash run JOB", "run a job headless (tpudash run JOB --help: its params)"),
    "runs": ("tpudash runs", "list recorded runs, newest first"),
    "watch": ("tpudash watch [RUN]", "follow a run as it grows (default: the newest live run)"),
    "telemetry": ("tpudash telemetry", "TPU duty cycle and HBM, host CPU and memory, every interval"),
    "export": ("tpudash export RUN", "export a run's metrics and telemetry"),
    "copy": ("tpudash copy RUN DEST", "copy runs to another runs directory or a bucket (gs://, s3://)"),
    "profile": ("tpudash profile RUN", "profile a live run's next steps and print XProf's verdict"),
    "advise": ("tpudash advise RUN", "a run's TPU pitfalls checklist, MFU and recompiles, each with the fix"),
    "serve": ("tpudash serve", "the dashboard in a web browser (one dashboard per tab)"),
    **hosts.COMMANDS,
}
# The global flags each command's help lists: the ones it uses. Every command accepts all of them, before
# or after its name (where a flag goes on the line never matters), but `tpudash runs --help` listing
# --cancel-grace would only say that it means something there.
RUNS_DIR_FLAGS = ("runs_dir", "store_timeout")
"""Where the runs are, and how long a store there may take to answer: every command that reads or writes runs."""
FLAGS_USED = {
    "devices": ("tpu", "cpu_devices", "framework"),
    "jobs": (),
    "run": GLOBAL_FLAGS,
    "runs": RUNS_DIR_FLAGS,
    "watch": (*RUNS_DIR_FLAGS, "tpu_metrics", "telemetry_interval"),  # it samples a live run of this host
    "telemetry": ("tpu_metrics", "telemetry_interval"),
    "export": RUNS_DIR_FLAGS,
    "copy": RUNS_DIR_FLAGS,
    "profile": RUNS_DIR_FLAGS,
    "advise": RUNS_DIR_FLAGS,
    "serve": GLOBAL_FLAGS + DASHBOARD_FLAGS,  # each tab's dashboard
    "hosts": RUNS_DIR_FLAGS,
    "agent": (*RUNS_DIR_FLAGS, "tpu_metrics"),  # its own --interval
}


class _Parser(argparse.ArgumentParser):
    epilog_when_shown: Callable[[], str] | None = None
    """Makes the epilog only when help is shown: what it needs stays unimported on the dashboard's way to its frame."""
    flags_shown: tuple[str, ...] | None = None
    """The global flags this parser's help and usage list (``FLAGS_USED``); None: all of them."""

    def format_help(self) -> str:
        if self.epilog_when_shown is not None:
            self.epilog = self.epilog_when_shown()
        with self._listing_only_flags_shown():
            return super().format_help()

    def format_usage(self) -> str:
        with self._listing_only_flags_shown():
            return super().format_usage()

    @contextmanager
    def _listing_only_flags_shown(self) -> Iterator[None]:
        """The global flags not in ``flags_shown`` left out of the help meanwhile (still parsed).

        Every command's parser shares the global flags' actions (argparse's
        ``parents``), so each hides them only while its own help is written.
        """
        hidden = [
            action
            for action in self._actions
            if self.flags_shown is not None
            and action.dest in GLOBAL_FLAGS + DASHBOARD_FLAGS
            and action.dest not in self.flags_shown
        ]
        helps = [action.help for action in hidden]
        for action in hidden:
            action.help = argparse.SUPPRESS
        try:
            yield
        finally:
            for action, help_text in zip(hidden, helps):
                action.help = help_text

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a choice; a mistyped command (``tpudash runz``) also gets the nearest one."""
        try:
            super()._check_value(action, value)  # argparse's own (private): its message is kept
        except argparse.ArgumentError as error:
            if not isinstance(action, argparse._SubParsersAction) or not isinstance(value, str):
                raise
            near = nearest_names(value, action.choices)
            hint = f"; did you mean {' or '.join(repr(name) for name in near)}?" if near else ""
            raise argparse.ArgumentError(action, f"{error.message}{hint}") from None

    def error(self, message: str) -> NoReturn:  # argparse's own errors: same prefix, exit 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"tpudash: error: {message}\n")


def _global_flags() -> _Parser:
    # SUPPRESS keeps a flag given before the subcommand from being reset by the
    # subparser's default, so `tpudash --cpu-devices 4 run …` and
    # `tpudash run … --cpu-devices 4` mean the same.
    flags = _Parser(add_help=False)
    group = flags.add_argument_group("session (also from TPUDASH_* variables)")
    group.add_argument(
        "--tpu",
        default=argparse.SUPPRESS,
        metavar="NAME|grpc://HOST:PORT|local|none",
        help="connect to this TPU; failure is an error, never a fallback; "
        "none: leave the TPU alone, run on the CPU default [TPUDASH_TPU]",
    )
    group.add_argument(
        "--cpu-devices",
        default=argparse.SUPPRESS,
        metavar="N",
        help="logical CPU devices when no accelerator is found (default 8) [TPUDASH_CPU_DEVICES]",
    )
    group.add_argument(
        "--framework",
        default=argparse.SUPPRESS,
        metavar="auto|tensorflow|jax",
        help="what runs the jobs: auto (default) is TensorFlow where it is installed, else JAX [TPUDASH_FRAMEWORK]",
    )
    group.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="tensorflow-datasets data directory [TPUDASH_DATA_DIR]",
    )
    group.add_argument(
        "--runs-dir",
        default=argparse.SUPPRESS,
        metavar="DIR|URL",
        help="where runs are kept: a directory, gs://BUCKET/PATH or s3://BUCKET/PATH "
        "(default $XDG_DATA_HOME/tpudash/runs) [TPUDASH_RUNS_DIR]",
    )
    group.add_argument(
        "--tpu-metrics",
        default=argparse.SUPPRESS,
        metavar="HOST:PORT",
        help="libtpu's metrics service on this host, read for TPU telemetry "
        "(default localhost:8431) [TPUDASH_TPU_METRICS]",
    )
    group.add_argument(
        "--telemetry-interval",
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds between telemetry samples; 0 turns sampling off (default 1) [TPUDASH_TELEMETRY_INTERVAL]",
    )
    group.add_argument(
        "--store-timeout",
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="how long a bucket (gs://, s3://) may take to answer before it counts as unreachable (default 8) "
        "[TPUDASH_STORE_TIMEOUT]",
    )
    # The dashboard's own, used by `tpudash` and `tpudash serve`; accepted by
    # every command, as the other session flags are, so that where a flag goes
    # on the line never matters.
    dashboard = flags.add_argument_group("dashboard (tpudash and tpudash serve; also from TPUDASH_* variables)")
    dashboard.add_argument(
        "--release-after",
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="release the accelerator (the engine exits) after this long idle; "
        "0 keeps it until quit or E (default 0) [TPUDASH_RELEASE_AFTER]",
    )
    dashboard.add_argument(
        "--cancel-grace",
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="how long a cancelled job may take to stop before its engine is ended (default 2) [TPUDASH_CANCEL_GRACE]",
    )
    return flags


def build_parser() -> argparse.ArgumentParser:
    flags = _global_flags()
    parser = _Parser(
        prog="tpudash",
        description="Terminal dashboard for TensorFlow accelerator sessions. Without a command, starts the TUI.",
        parents=[flags],
    )
    parser.add_argument("--version", action="version", version=f"tpudash {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    devices = commands.add_parser("devices", parents=[flags], help=COMMANDS["devices"][1])
    devices.add_argument("--json", action="store_true", help="print the description as JSON")

    jobs = commands.add_parser("jobs", parents=[flags], help=COMMANDS["jobs"][1])
    jobs.add_argument("--json", action="store_true", help="print the job list as JSON")

    # Its own --help: with a job named, the help lists that job's params.
    run = commands.add_parser(
        "run",
        parents=[flags],
        help=COMMANDS["run"][1],
        add_help=False,
        description="Run a job headless. `tpudash run JOB --help` lists the job's params "
        "(name, default, what is allowed); `tpudash jobs` lists every job.",
    )
    run.epilog_when_shown = _booleans_epilog
    run.add_argument("-h", "--help", action="store_true", help="show this help, and the params of JOB if given")
    run.add_argument("job", nargs="?", help="job name, e.g. matmul, gradient-descent, train")
    run.add_argument(
        "--set", dest="assignments", action="append", default=[], metavar="NAME=VALUE", help="set a param (repeatable)"
    )
    run.add_argument(
        "--name",
        metavar="NAME",
        help="what History and `tpudash runs` call this run (default: the job and its dataset/model, "
        "e.g. 'train mnist mnist-cnn')",
    )
    run.add_argument("--json", action="store_true", help="print one JSON event per line instead of the live display")
    run.add_argument(
        "--profile-steps",
        metavar="A-B",
        help="profile global steps A to B into <run>/profile (a job with training steps, e.g. train; "
        "tpudash profile RUN --list shows them); every run also answers tpudash profile RUN while it trains",
    )
    cluster = run.add_argument_group(
        "many workers (MultiWorkerMirroredStrategy; a job with a workers param, e.g. train)",
        "--workers N starts N workers on this machine, one run. On a cluster, every host runs the same "
        "command with its own --worker-index and the same --cluster (or the TF_CONFIG it is given).",
    )
    cluster.add_argument(
        "--workers", metavar="N", help="train on N workers started on this machine (1 to 64; = --set workers=N)"
    )
    cluster.add_argument(
        "--worker-index",
        metavar="I",
        help="this process is worker I of --cluster (0 is the chief, which writes the run); needs --cluster",
    )
    cluster.add_argument(
        "--cluster",
        metavar="HOST:PORT,…",
        help="every worker's address, worker 0 first (sets TF_CONFIG; without these flags an exported TF_CONFIG is used)",
    )
    cluster.add_argument(
        "--run-id",
        metavar="ID",
        help="record into this run id (every worker of a cluster gives the same; default: a new id, the chief's)",
    )
    run.set_defaults(run_parser=run)  # for its usage line in errors and help

    runs = commands.add_parser(
        "runs",
        parents=[flags],
        help=COMMANDS["runs"][1],
        description="List the runs in the runs directory (--runs-dir, else TPUDASH_RUNS_DIR, else "
        "$XDG_DATA_HOME/tpudash/runs), newest first as History lists them. A directory that does not "
        "exist is an error (exit 2); an empty one lists nothing (exit 0).",
    )
    runs.add_argument("--json", action="store_true", help="print the runs as JSON (a list, newest first)")

    watch = commands.add_parser(
        "watch",
        parents=[flags],
        help=COMMANDS["watch"][1],
        description="Follow a run headless, printed as `tpudash run` prints it: a tpudash job, or your own "
        "training with TpudashCallback or tpudash.record. Exits when the run ends, with the exit "
        "code of its status (done 0, failed 1, cancelled 130; interrupted, when the process "
        "writing it dies, 1).",
    )
    watch.add_argument(
        "run_id", nargs="?", metavar="RUN", help="run id (a unique prefix is enough); default: the newest live run"
    )
    watch.add_argument("--json", action="store_true", help="print one JSON event per line instead of the live display")

    telemetry = commands.add_parser(
        "telemetry",
        parents=[flags],
        help=COMMANDS["telemetry"][1],
        description="Sample the TPU (libtpu's metrics service, through tpu-info's client) and the host (psutil) "
        "without touching TensorFlow, so it also sees a TPU another process holds. Until Ctrl-C, "
        "or once with --once. A source that answers nothing says why.",
    )
    telemetry.add_argument("--once", action="store_true", help="take one sample, print it and exit")
    telemetry.add_argument("--json", action="store_true", help="print each sample as one JSON object per line")

    serve = commands.add_parser(
        "serve",
        parents=[flags],
        help=COMMANDS["serve"][1],
        description="Serve the dashboard to web browsers through textual-serve: every browser tab runs its own "
        "dashboard with these settings. Listens on 127.0.0.1 unless told otherwise; remote machines: "
        "ssh -L 8000:localhost:8000 HOST. Open the URL it prints: it carries the token every page needs "
        "(a cookie keeps it after the first visit). Ctrl-C stops the server and every dashboard it started.",
    )
    serve.add_argument(
        "--host",
        metavar="ADDRESS",
        help="address to listen on (default 127.0.0.1); one that is not loopback also needs --public",
    )
    serve.add_argument("--port", metavar="PORT", help="port to listen on (default 8000; 0: any free port)")
    serve.add_argument(
        "--public",
        action="store_true",
        help="allow listening beyond loopback (alone: every interface); anyone who reaches the "
        "port can launch jobs on this machine",
    )
    serve.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        help="also answer to this Host name (repeatable), e.g. the name a LAN browser uses under --public; "
        "otherwise only loopback names, the bound address and this machine's own names (against DNS rebinding)",
    )
    serve.add_argument(
        "--max-dashboards",
        metavar="N",
        help="at most N browser tabs run a dashboard (and its engine) at once (default 4); one more is told why",
    )
    serve.add_argument(
        "--allow-any-host-header",
        action="store_true",
        help="behind a proxy that rewrites the Host header (Colab's): accept any; otherwise a "
        "loopback server answers only to localhost names, against DNS rebinding",
    )

    export = commands.add_parser("export", parents=[flags], help=COMMANDS["export"][1])
    export.add_argument("run_id", metavar="RUN", help="run id (a unique prefix is enough)")
    export.add_argument("--format", choices=("csv", "json"), default="csv", help="output format (default csv)")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")

    copy = commands.add_parser(
        "copy",
        parents=[flags],
        help=COMMANDS["copy"][1],
        description="Copy runs into another runs directory: from this host's into a bucket (gs://BUCKET/PATH, "
        "s3://BUCKET/PATH) and back, or between buckets. Each file goes once: running the same copy again "
        "(after a network failure, or when a copied run has ended) copies only what is new. Also uploads what a "
        "store did not take (`tpudash copy ~/.cache/tpudash/unsent/RUN gs://BUCKET/PATH`).",
    )
    copy.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="a run id in the runs directory (a unique prefix is enough), or the path or URL of one run directory",
    )
    copy.add_argument("dest", metavar="DEST", help="the runs directory to copy into: a path, gs://… or s3://…")
    copy.add_argument("--all", action="store_true", help="copy every run of the runs directory (--runs-dir)")
    profiling.add_profile_parser(commands, flags, COMMANDS["profile"][1])
    advising.add_advise_parser(commands, flags, COMMANDS["advise"][1])
    hosts.add_hosts_parsers(commands, flags)
    for name, command in commands.choices.items():
        if isinstance(command, _Parser):
            command.flags_shown = FLAGS_USED[name]
    return parser


def _booleans_epilog() -> str:
    from jobs.base import BOOL_SPELLINGS  # the job protocol and msgspec: not before the dashboard's first frame

    return f"Booleans: {BOOL_SPELLINGS}."
