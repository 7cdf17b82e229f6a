"""One process of a multi-process JAX job on the CPU, recording its loop with ``tpudash.record``.

``python -m tests.jax.jax_process PORT INDEX COUNT RUNS_DIR [RUN_ID]``: joins
the job through ``jax.distributed.initialize`` (the coordinator on
127.0.0.1:PORT), records three steps of a loss (jax scalars) and its
values per device (a global array's shards) into RUN_ID (none given: what ``tpudash.record`` does
without one), and prints one JSON line: its process index and count, and
the run id or the refusal it got. tests/jax/test_jax_processes.py starts them.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    port, index, count, runs_dir = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    run_id = argv[4] if len(argv) > 4 else None
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=index, initialization_timeout=60
    )
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import tpudash
    from tpudash.recording import RecordingError

    report = {"index": jax.process_index(), "count": jax.process_count()}
    sharding = NamedSharding(jax.make_mesh((jax.device_count(),), ("batch",)), PartitionSpec("batch"))
    positions = np.arange(jax.device_count(), dtype=np.float32)
    try:
        with tpudash.record("jax processes", params={"processes": count}, runs_dir=runs_dir, run_id=run_id) as run:
            for step in range(3):
                run.metric("loss", jnp.float32(1.0 / (step + 1) + index), step=step)
                run.progress(step + 1, 3, "step")
            # A global array over every process's devices: each process records the shards it holds.
            run.replica_values(
                "position", jax.make_array_from_callback((len(positions),), sharding, positions.__getitem__)
            )
        report["run_id"] = run.run_id
    except RecordingError as error:
        report["refused"] = str(error)
    print(json.dumps(report), flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
