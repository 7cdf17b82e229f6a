"""``python -m tpudash.engine``: the engine process (see ``tpudash.engine.process``)."""

from tpudash.engine.process import main

if __name__ == "__main__":
    raise SystemExit(main())
