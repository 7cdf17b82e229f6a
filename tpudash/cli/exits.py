"""How a ``tpudash`` command ends: its exit codes, and ``BadInput`` for what the user typed that cannot be used.

A leaf, so the parser (``tpudash.cli.parser``), the dispatch (``tpudash.cli.main``) and the
commands (``tpudash.cli.commands``) share the codes, and the commands need not import the parser.
"""

from __future__ import annotations

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_CANCELLED = 130
EXIT_BY_STATUS = {"done": EXIT_DONE, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}


class BadInput(Exception):
    """Anything the user typed that cannot be used; exit code 2."""
