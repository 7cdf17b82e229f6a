"""The dashboard needs a terminal: which standard streams are not one, and what to use instead.

``tpudash`` alone checks this before anything heavy is imported
(``tpudash.cli.main``); the message lists the headless commands, and on
Colab also its terminal and ``colab.show()``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from tpudash.cli.parser import COMMANDS

# Set in every Colab runtime (CPU, GPU and TPU): cheap to read, no import needed.
COLAB_VARIABLES = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_TPU_ADDR")


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
    lines = [
        f"tpudash: error: the dashboard needs a terminal, and {what} {verb} not one "
        "(a pipe, a file or a notebook cell).",
        "These commands work without one:",
    ]
    lines += [f"  {usage.ljust(width)}  {what_it_does}" for usage, what_it_does in COMMANDS.values()]
    if colab:
        lines.append(
            "On Colab, open its terminal (the terminal icon at the bottom left, or Tools → Terminal) "
            "and run tpudash there, or show the dashboard in a cell: "
            "from tpudash import colab; colab.show()"
        )
    return "\n".join(lines)
