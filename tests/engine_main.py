"""``python -m tests.engine_main``: the engine process with the test suite's extra jobs (``tests.engine_jobs``).

An installed tpudash runs only the jobs it ships; a test that needs a job
that must never ship (one aborts its process) starts this module instead of
``python -m tpudash.engine``, through ``EngineProcess(module=ENGINE_MAIN)``.
"""

from __future__ import annotations

ENGINE_MAIN = "tests.engine_main"

if __name__ == "__main__":
    from tests.engine_jobs import SPECS
    from tpudash.engine.__main__ import main

    raise SystemExit(main(SPECS))
