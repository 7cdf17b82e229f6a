"""``tpudash advise RUN``: a run's TPU pitfalls checklist, its MFU and its recompiles, as its writer judged them.

The run's writer (``tpudash run``'s train job, ``TpudashCallback``,
``tpudash.record``) keeps ``advice.json`` in the run (``tpudash.advice.report``):
every rule once, the MFU with where its peak and its FLOPs come from, and the
compile marks. This command reads it (a run on this host or in a bucket, by
id, prefix, path or URL, as ``tpudash copy`` takes a run), judges the
``input-bound`` rule from what only a reader has — the run's telemetry and its
newest profile (``tpudash.advice.inputbound``) — and prints it: the rules that
fire first, each with the line to change, then those not checked (and why),
then the quiet ones. ``--json``: ``AdviceReport.to_json()`` with ``"run"``.

Exit codes: 0 the advice printed (whether or not a rule fires); 1 advice.json
unreadable (what is wrong with it is named); 2 bad input, or no advice recorded
for the run (runs recorded before tpudash kept advice, or by a writer without it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from tpudash.cli.commands import reaching
from tpudash.cli.copying import _copy_source as find_run  # a run by id, prefix, path or URL: as `copy` takes it
from tpudash.cli.exits import EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from tpudash.advice.report import AdviceReport
    from tpudash.config import Settings

STATE_ORDER = ("fires", "not checked", "quiet")
STATE_MARKS = {"fires": ("▲", "bold yellow"), "not checked": ("?", "dim"), "quiet": ("✓", "green")}
MARKS_SHOWN = 20
NO_ADVICE = (
    "no advice recorded for {run} (runs recorded before tpudash kept advice.json, or by a writer without "
    "advice: a job with no model to judge, such as matmul)"
)


def add_advise_parser(commands: Any, flags: argparse.ArgumentParser, help_text: str) -> argparse.ArgumentParser:
    """``tpudash advise``'s parser, added to the subcommands."""
    advise = commands.add_parser(
        "advise",
        parents=[flags],
        help=help_text,
        description="Show a run's TPU pitfalls checklist as its writer judged it (advice.json): padding to the "
        "matrix unit's 8x128 tiles, recompiles, the tf.data pipeline (prefetch, parallel map, cache, shuffle "
        "before repeat, parallel interleave, py_function), input-bound (judged here from the run's telemetry "
        "and its newest profile), small batches, mixed precision; each rule that fires with the line to change, "
        "a rule that could not be judged with why. Then the MFU with where its peak and its FLOPs come from, "
        "and the step functions' recompiles. A live run's advice is as of its newest epoch. Exit codes: "
        "0 printed, 1 advice.json unreadable, 2 bad input or no advice recorded for the run.",
    )
    advise.add_argument(
        "run_id",
        metavar="RUN",
        help="run id (a unique prefix is enough), or the path or URL of one run directory",
    )
    advise.add_argument("--json", action="store_true", help="print advice.json's object, with the run's id as run")
    return advise


def command_advise(args: argparse.Namespace, settings: Settings) -> int:
    """Print a run's advice; see the module's docstring for what and the exit codes."""
    from tpudash.advice.inputbound import with_input_bound
    from tpudash.advice.report import read_report
    from tpudash.runs.store import RunStore

    runs_dir, run_id = find_run(args.run_id, settings)
    with reaching(runs_dir):
        files = RunStore(runs_dir).files(run_id)
        try:
            report = read_report(files)
        except ValueError as error:
            print(f"tpudash: run {run_id}: {error}", file=sys.stderr)
            return EXIT_FAILED
        if report is None:
            print(f"tpudash: {NO_ADVICE.format(run=run_id)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        report = with_input_bound(report, files)
    if args.json:
        print(json.dumps({"run": run_id, **report.to_json()}, indent=2, default=str))
        return EXIT_DONE
    from tpudash.cli.render import output_console

    render_advice(report, run_id, output_console(highlight=False))
    return EXIT_DONE


def render_advice(report: AdviceReport, run_id: str, console: Console) -> None:
    """A report as a user reads it: the MFU, every rule (firing first, each with its fix), the compile marks."""
    from rich.table import Table
    from rich.text import Text

    from tpudash.format import format_timestamp

    device = "on a TPU" if report.on_tpu else "not on a TPU"
    framework = f"{report.framework}, " if report.framework else ""
    console.print(
        Text.assemble(
            ("advice for ", "bold"),
            (run_id, "bold cyan"),
            f" ({framework}{device}; judged {format_timestamp(report.updated)})",
        )
    )
    console.print(mfu_text(report))
    rules = Table.grid(padding=(0, 1))
    rules.add_column(no_wrap=True)
    rules.add_column(no_wrap=True)
    rules.add_column(overflow="fold")
    for advice in sorted(report.advice, key=lambda item: STATE_ORDER.index(item.state)):
        mark, style = STATE_MARKS[advice.state]
        said = Text(advice.summary, style="bold" if advice.state == "fires" else "")
        if advice.state == "fires" and advice.fix:
            said.append(f"\nfix: {advice.fix}", style="cyan")
        if advice.rule == "input-bound":
            for label, key in (("duty cycle", "duty_hint_source"), ("profile", "input_percent_source")):
                if advice.detail.get(key):
                    said.append(f"\n{label}: {advice.detail[key]}", style="dim")
        rules.add_row(Text(mark, style=style), Text(advice.rule, style=style), said)
    console.print(rules)
    marks = report.marks
    if not marks:
        console.print(Text("compile marks: none recorded", style="dim"))
        return
    console.print(Text(f"compile marks ({len(marks)}):", style="bold"))
    for mark_ in marks[:MARKS_SHOWN]:
        cause = f": {mark_.cause}" if mark_.cause else ""
        console.print(Text(f"  step {mark_.step}  {mark_.function} (compile {mark_.count}){cause}"))
    if len(marks) > MARKS_SHOWN:
        console.print(Text(f"  … {len(marks) - MARKS_SHOWN} more (tpudash advise {run_id} --json lists them)"))


def mfu_text(report: AdviceReport) -> Text:
    """``MFU 22.9 %`` (or unknown, and why) and, under it, where its peak and its FLOPs per step come from."""
    from rich.text import Text

    mfu = report.mfu
    if mfu is None:
        return Text("MFU not measured yet: it comes with the run's first epoch", style="dim")
    text = Text(mfu.text(), style="bold" if mfu.mfu is not None else "yellow")
    text.append(f"\n  peak: {mfu.peak_source or 'not said'}", style="dim")
    text.append(f"\n  FLOPs per step: {mfu.flops_source or 'not said'}", style="dim")
    return text
