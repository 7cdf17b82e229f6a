"""tpudash's version: a leaf, so the CLI's ``--version`` imports nothing else of tpudash."""

from __future__ import annotations

__version__ = "0.1.0"
