"""Entry point for ``python -m tpudash``."""

from tpudash.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
