"""The CPU standing in for a TPU board under JAX: 8 host devices that a 2-core machine can run collectives on.

Set before JAX starts its CPU backend (it reads them once): by
tests/jax/conftest.py for the tests and what they start, and by the
Keras-on-JAX benchmark for its measuring process.

- ``XLA_FLAGS=--xla_force_host_platform_device_count=8``: XLA splits the CPU
  into 8 devices, as ``TPUStrategy`` sees a board's 8 cores.
- ``NPROC``: XLA's CPU client runs every device's program on one Eigen
  pool of ``max(NPROC or the cores, devices)`` threads. With 8 devices on 2
  cores that is 8 threads: 7 devices' programs block in an all-reduce while
  the 8th's matmul waits for a pool thread, and XLA aborts the process
  after 40 s ("Expected 8 threads to join the rendezvous, but only 7 of them
  arrived"; a DataParallel fit with 256 features did, every time). Twice
  the devices leaves threads for the matmuls. A TPU runs no collective on
  host threads: this is the stand-in's setting, not the product's.
"""

from __future__ import annotations

from collections.abc import Mapping

DEVICES = 8
EIGHT_HOST_DEVICES = f"--xla_force_host_platform_device_count={DEVICES}"
POOL_THREADS = str(2 * DEVICES)


def stand_in_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the 8 host devices and XLA's pool size added (a value already there is kept)."""
    environment = dict(environ)
    xla_flags = environment.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in xla_flags:
        environment["XLA_FLAGS"] = f"{xla_flags} {EIGHT_HOST_DEVICES}".strip()
    environment.setdefault("NPROC", POOL_THREADS)
    return environment
