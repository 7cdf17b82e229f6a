"""``tpudash hosts [--json]`` and ``tpudash agent``: every host's chips, CPU and memory, and the agent that reports them.

``agent`` runs once per host (``tpudash.telemetry.agent``): it samples the
host and writes it into the runs directory until SIGTERM or Ctrl-C (exit 0).
``hosts`` reads every host's latest report from the runs directory
(``tpudash.runs.hosts``): a table, or one JSON object per host. Every cell
is whole: a host's state and age in words (``live 2 s ago``, ``stale 5 min
ago``, ``stopped 3 min ago``, ``clock ahead 2 h``), and why a host has no
chip figures on a line of its own under the table, never cut. On a terminal
the table fits its width (the host name, then the runs, left out first);
piped, it is one line per host at its own width, so ``grep`` and ``cut``
see whole rows. Exit codes:
0 done, 2 bad input; a store that does not answer is one line and 1 (as
every command that reads a store).

``add_hosts_parsers(subparsers, flags)`` adds both commands to ``tpudash``'s
parser; ``command_hosts`` and ``command_agent`` run them.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from tpudash.cli.exits import EXIT_DONE, BadInput

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    from tpudash.config import Settings
    from tpudash.runs.hosts import HostStatus

COMMANDS = {
    "hosts": ("tpudash hosts", "every host's chips (duty cycle, HBM), CPU, memory and heartbeat, from its agent"),
    "agent": ("tpudash agent", "report this host into the runs directory (one per host; no inbound port)"),
}
# Per-chip duty cycles are listed up to this many chips; more are summed up as their mean.
MAX_CHIPS_LISTED = 8
# The columns a narrow terminal gives up, in this order, before a cell is cut.
OPTIONAL_COLUMNS = [("host name",), ("runs",), ("memory",), ("HBM",)]
# The columns that may wrap, at spaces only (a name, a list of runs, a list of duty cycles); the rest stay whole.
WRAPPING_COLUMNS = ("host name", "duty cycle", "runs")


def add_hosts_parsers(subparsers: Any, flags: argparse.ArgumentParser) -> None:
    """``hosts`` and ``agent`` on ``tpudash``'s subparsers; ``flags``: the global flags every command accepts."""
    hosts = subparsers.add_parser(
        "hosts",
        parents=[flags],
        help=COMMANDS["hosts"][1],
        description="List the hosts whose agents (`tpudash agent`) report into the runs directory: each host's "
        "chips (duty cycle, HBM used of total), CPU, memory, and how long ago it last reported. A host whose "
        "agent stops reporting turns stale after three of its intervals (15 s at the default interval); one "
        "whose agent was stopped says stopped; one whose heartbeat is from the future says clock ahead.",
    )
    hosts.add_argument("--json", action="store_true", help="print one JSON object per host (a JSON list)")

    agent = subparsers.add_parser(
        "agent",
        parents=[flags],
        help=COMMANDS["agent"][1],
        description="Sample this host (libtpu's metrics service at --tpu-metrics, CPU and memory) every interval "
        "and write it into the runs directory (--runs-dir, usually gs://BUCKET/PATH): the host's report for "
        "`tpudash hosts` and the dashboard's Hosts view, and the telemetry of the live runs on this host that "
        "nothing else samples. Needs no inbound port. Stops on SIGTERM or Ctrl-C (exit 0). On every VM of a "
        'TPU slice: gcloud compute tpus tpu-vm ssh NAME --worker=all --command "tpudash agent --runs-dir gs://…"',
    )
    agent.add_argument(
        "--name",
        dest="host_name",
        metavar="NAME",
        help="this host's name in the store (default: the hostname); tells agents on one machine apart",
    )
    agent.add_argument(
        "--interval",
        dest="agent_interval",
        metavar="SECONDS",
        help="seconds between samples and reports, 0.1 to 600 (default 5); a bucket may throttle "
        "replacing one object more than once a second",
    )


def command_hosts(args: argparse.Namespace, settings: Settings) -> int:
    """Print every host's latest report: a table, or JSON with ``--json``."""
    import time

    from tpudash.cli.commands import reaching, readable_runs_dir
    from tpudash.runs.hosts import HostsReader

    runs_dir = readable_runs_dir(settings)
    with reaching(runs_dir):
        reader = HostsReader(runs_dir)
        hosts = reader.read()
    now = time.time()  # after the read: a heartbeat written while a slow store answered is not from the future
    for problem in reader.problems:
        print(f"tpudash: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps([host.to_dict(now) for host in hosts], indent=2))
        return EXIT_DONE
    if not hosts:
        print(
            f"no host reports to {reader.where}; start `tpudash agent --runs-dir {runs_dir}` on each host",
            file=sys.stderr,
        )
        return EXIT_DONE
    from tpudash.cli.render import output_console

    print_hosts(output_console(), hosts, now)  # piped: whole rows, one line per host, for grep and cut
    return EXIT_DONE


def print_hosts(console: Console, hosts: list[HostStatus], now: float) -> None:
    """The table fitted to ``console`` (columns left out before a cell is cut), then each host's problem whole."""
    from tpudash.cli.render import print_fitted

    print_fitted(console, lambda left_out: hosts_table(hosts, now, left_out), OPTIONAL_COLUMNS)
    for line in host_notes(hosts, now):
        console.print(line)


def duty_cycles(host: HostStatus) -> str:
    """``88 62 25 12%`` per chip (a mean past ``MAX_CHIPS_LISTED``), or the reason there are none."""
    duties = [chip.duty_cycle for chip in host.chips]
    known = [duty for duty in duties if duty is not None]
    if not known:
        return "n/a"
    if len(duties) > MAX_CHIPS_LISTED:
        return f"mean {sum(known) / len(known):.0f}%"
    return " ".join("-" if duty is None else f"{duty:.0f}" for duty in duties) + "%"


def age_words(seconds: float) -> str:
    """``3 s ago``, ``12 min ago``, ``5 h ago``: a heartbeat's age at a glance."""
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


STATE_STYLES = {"live": "green", "stale": "red", "stopped": "yellow", "clock ahead": "magenta"}


def state_words(host: HostStatus, now: float) -> str:
    """``live 2 s ago``, ``stale 5 min ago``, ``stopped 3 min ago``, ``clock ahead 2 h``: the state, then the age."""
    from tpudash.runs.heartbeat import CLOCK_AHEAD, seconds_words

    state = host.state(now)
    if state == CLOCK_AHEAD:
        return f"{state} {seconds_words(host.heartbeat - now)}"
    return f"{state} {age_words(host.age(now))}"


def host_notes(hosts: list[HostStatus], now: float) -> list[Text]:
    """The lines under the table: why a host has no chip figures, whole (a cell would cut it)."""
    from rich.text import Text

    return [
        Text.assemble(("⚠ ", "yellow"), (f"{host.name}: ", "bold"), (host.problem, "yellow"))
        for host in hosts
        if host.problem and host.state(now) != "stopped"
    ]


def hosts_table(hosts: list[HostStatus], now: float, left_out: tuple[str, ...] = ()) -> RichTable:
    """The hosts as ``tpudash hosts`` prints them; ``left_out``: columns dropped to fit the terminal.

    Only ``WRAPPING_COLUMNS`` may wrap, at spaces; every other cell is one
    line, whole (its column is never narrower than its widest cell). A host whose agent stopped shows no figures: its last ones are not current.
    """
    from rich.table import Table as RichTable
    from rich.text import Text

    from tpudash.format import format_used_of

    columns = ["host", "host name", "state", "chips", "duty cycle", "HBM", "CPU", "memory", "runs"]
    shown = [column for column in columns if column not in left_out]
    rows = []
    for host in hosts:
        state = host.state(now)
        current = state != "stopped"
        used = [chip.hbm_used for chip in host.chips if chip.hbm_used is not None]
        totals = [chip.hbm_total for chip in host.chips if chip.hbm_total is not None]
        cells = {
            "host": Text(host.name, style="bold"),
            "host name": Text(host.hostname if host.hostname != host.name else ""),
            "state": Text(state_words(host, now), style=STATE_STYLES.get(state, "")),
            "chips": Text(str(len(host.chips)) if host.chips else "none" + (" ⚠" if host.problem else "")),
            "duty cycle": Text(duty_cycles(host) if current else "—"),
            "HBM": Text(
                (format_used_of(sum(used) if used else None, sum(totals) if totals else None) or "n/a")
                if current
                else "—"
            ),
            "CPU": Text("—" if not current else "n/a" if host.cpu_percent is None else f"{host.cpu_percent:.0f}%"),
            "memory": Text((format_used_of(host.memory_used, host.memory_total) or "n/a") if current else "—"),
            "runs": Text(", ".join(host.runs)),
        }
        rows.append([cells[column] for column in shown])
    # A column no host fills (every host name its folder's, no run anywhere) says nothing: left out.
    empty = [position for position, column in enumerate(shown) if column in ("host name", "runs")]
    empty = [position for position in empty if rows and not any(row[position].plain for row in rows)]
    shown = [column for position, column in enumerate(shown) if position not in empty]
    rows = [[cell for position, cell in enumerate(row) if position not in empty] for row in rows]
    table = RichTable(title_justify="left")
    for position, column in enumerate(shown):
        whole = column not in WRAPPING_COLUMNS
        widest = max([len(column), *(row[position].cell_len for row in rows)]) if whole else None
        table.add_column(column, no_wrap=whole, min_width=widest)
    for row in rows:
        table.add_row(*row)
    return table


def command_agent(args: argparse.Namespace, settings: Settings) -> int:
    """Report this host into the runs directory until SIGTERM or Ctrl-C; 0 when stopped."""
    from tpudash.cli.commands import readable_runs_dir
    from tpudash.runs.hosts import HOST_INTERVAL_SECONDS
    from tpudash.telemetry.agent import HostAgent, check_host_name, check_interval, default_host_name, run_agent

    try:
        name = check_host_name(args.host_name) if args.host_name is not None else default_host_name()
    except ValueError as error:
        raise BadInput(f"--name: {error}") from None
    try:
        interval = check_interval(args.agent_interval) if args.agent_interval is not None else HOST_INTERVAL_SECONDS
    except ValueError as error:
        raise BadInput(f"--interval: {error}") from None
    runs_dir = readable_runs_dir(settings)
    stop = threading.Event()

    def stop_on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_on_signal)
    agent = HostAgent(runs_dir, name, _sampler(settings), interval=interval)
    where = runs_dir if isinstance(runs_dir, str) else Path(runs_dir)
    print(f"tpudash: agent {name}: reporting this host into {where} every {interval:g} s", file=sys.stderr, flush=True)
    run_agent(agent, stop)
    return EXIT_DONE


def _sampler(settings: Settings) -> Any:
    """This host's sampler, keeping one sample of history: the agent writes each sample out, and keeps none."""
    from collections import deque

    from tpudash.telemetry.sampling import telemetry_sampler

    sampler = telemetry_sampler(settings)
    sampler.history = deque(maxlen=1)
    return sampler
