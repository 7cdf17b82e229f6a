"""``tpudash copy RUN [RUN ...] DEST`` (or ``--all DEST``): runs into another runs directory, a path or a store URL.

Each RUN is a run id (or a unique prefix) in the runs directory, or the path
or URL of one run directory (a spill directory ``~/.cache/tpudash/unsent/<run
id>`` its writer could not upload); the copying itself, each file once, is
``tpudash.runs.transfer``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tpudash.cli.commands import checked_store, one_line, reaching, readable_runs_dir, runs_dir_source
from tpudash.cli.exits import EXIT_DONE, EXIT_FAILED, BadInput

if TYPE_CHECKING:
    from tpudash.config import Settings


def command_copy(args: argparse.Namespace, settings: Settings) -> int:
    """Copy runs into another runs directory (a path or a store URL), each file once (``tpudash.runs.transfer``)."""
    from tpudash.runs.store import RunStore
    from tpudash.runs.transfer import LinkInTheWay, copy_run, same_place

    destination = copy_destination(args.dest)
    if args.all:
        if args.runs:
            raise BadInput(f"--all copies every run of the runs directory: give only DEST, not {args.runs[0]!r} too")
        sources = _every_run(args, settings)
        if not sources:
            print(f"no runs in {readable_runs_dir(settings)}: nothing to copy")
            return EXIT_DONE
    elif not args.runs:
        raise BadInput("RUN: name the runs to copy (run ids, or run directories), then DEST; or --all DEST")
    else:
        sources = list(dict.fromkeys(_copy_source(text, settings) for text in args.runs))
    for runs_dir, run_id in sources:
        if same_place(runs_dir, destination):
            raise BadInput(f"DEST: {destination} is where run {run_id} already is; name another runs directory")
        if str(destination).rstrip("/").endswith(f"/{run_id}"):
            raise BadInput(f"DEST: name the runs directory to copy {run_id} into, not the run itself: {destination}")
    with reaching(destination):
        target = RunStore(destination)
        try:
            target.prepare()
        except OSError as error:
            raise BadInput(f"DEST: cannot create {destination}: {error.strerror or error}") from None
    refused = False
    for runs_dir, run_id in sources:
        doing = f"; copying {run_id} stopped: the same command goes on where it stopped"
        try:
            with reaching(runs_dir, doing), reaching(destination, doing):
                try:
                    report = copy_run(RunStore(runs_dir), run_id, target)
                except LinkInTheWay as error:  # raised in here: ``reaching`` says a store's errors, not this one
                    raise BadInput(f"DEST: cannot copy {run_id}: {error}") from None
        except OSError as error:  # this host's disk: full, or not writable
            print(f"tpudash: error: cannot copy {run_id} to {destination}: {one_line(error)}", file=sys.stderr)
            return EXIT_FAILED
        if report.copied:
            line = f"copied {run_id} to {report.destination}: {_files(report.copied)}, {report.copied_bytes / 1024:,.1f} KiB"
            if report.skipped:
                line += f" ({_files(report.skipped)} already there)"
        else:
            line = f"{run_id}: already there, in {report.destination}"
        if report.still_running:
            line += "; it is still running: copy it again once it ends"
        print(line)
        for reason in report.refused:
            print(f"tpudash: {run_id}: not copied: {reason}", file=sys.stderr)
            refused = True
    return EXIT_FAILED if refused else EXIT_DONE


def _files(count: int) -> str:
    return f"{count} file{'' if count == 1 else 's'}"


def copy_destination(text: str) -> Path | str:
    """DEST of ``tpudash copy``: a runs directory (created if need be) or a store URL; else BadInput naming DEST."""
    from tpudash.runs.location import parse_runs_dir

    try:
        destination = parse_runs_dir(text)
    except ValueError as error:
        raise BadInput(f"DEST: {error}") from None
    if isinstance(destination, str):
        return checked_store(destination, "DEST")
    if destination.exists() and not destination.is_dir():
        raise BadInput(f"DEST: {destination} is not a directory; name a runs directory (a path or a store URL)")
    return destination


def _every_run(args: argparse.Namespace, settings: Settings) -> list[tuple[Path | str, str]]:
    """Every run of the runs directory (``--all``)."""
    from tpudash.runs.store import RunStore

    runs_dir = readable_runs_dir(settings)
    if isinstance(runs_dir, Path) and not runs_dir.exists():
        raise BadInput(f"{runs_dir_source(args)}: {runs_dir} does not exist, so it holds no runs to copy")
    with reaching(runs_dir):
        return [(runs_dir, run_id) for run_id in RunStore(runs_dir).run_ids()]


def _copy_source(text: str, settings: Settings) -> tuple[Path | str, str]:
    """RUN of ``tpudash copy``: (the runs directory it is in, its id); BadInput naming it when there is no such run.

    A run id (or a unique prefix) is looked up in the runs directory; a path
    or URL names one run directory (a spill directory
    ``~/.cache/tpudash/unsent/<run id>`` too), whose parent is the runs directory.
    """
    from tpudash.runs.location import parse_runs_dir
    from tpudash.runs.store import RunStore, run_id_of
    from tpudash.runs.transfer import split_run_location

    looks_like_a_place = "/" in text or text.startswith("~") or text in (".", "..")
    if not looks_like_a_place:
        runs_dir = readable_runs_dir(settings)
        with reaching(runs_dir):
            try:
                return runs_dir, run_id_of(RunStore(runs_dir).find(text))
            except KeyError as error:
                if not Path(text).is_dir():  # else: a run directory here, named without its path
                    raise BadInput(f"RUN: {error.args[0]}") from None
    try:
        location = parse_runs_dir(text)
    except ValueError as error:
        raise BadInput(f"RUN: {error}") from None
    if isinstance(location, str):
        checked_store(location, f"RUN {text}")
    try:
        runs_dir, run_id = split_run_location(location)
    except ValueError as error:
        raise BadInput(f"RUN: {text}: {error}") from None
    with reaching(runs_dir):
        if not RunStore(runs_dir).files(run_id).exists():
            raise BadInput(f"RUN: {text}: no run there (no such directory, or it holds no files)")
    return runs_dir, run_id
