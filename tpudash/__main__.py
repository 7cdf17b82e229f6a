"""Entry point for ``python -m tpudash``: the same as the ``tpudash`` script."""

from __future__ import annotations

from tpudash.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
