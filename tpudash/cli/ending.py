"""How the ``tpudash`` process ends early: quietly when its reader went away, at once after the dashboard.

``tpudash.cli.main`` calls these; the exit codes themselves are
``tpudash.cli.exits``.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from tpudash.cli.exits import EXIT_DONE


def reader_went_away() -> int:
    """The reader of standard output has what it wanted (``| head``): nothing to say, nothing failed."""
    from tpudash.cli.sinks import silence_output

    silence_output(sys.stdout)  # so the flush at exit has nowhere to fail
    return EXIT_DONE


def leave_now(code: int) -> NoReturn:
    """End the process at once, as ``exit`` would less the interpreter's teardown.

    After the dashboard, that teardown frees every widget of every screen one
    by one (~0.2 s between the app's end and the shell's prompt, measured in
    tmux) and nothing of it is needed: the engine was released, the runs and
    the session log are closed. The exit hooks still run and the streams are
    flushed.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
