"""The CPU standing in for a TPU board under JAX: 8 host devices that a 2-core machine can run collectives on.

Set before JAX starts its CPU backend (it reads them once): by
tests/jax/conftest.py for the tests and what they start, and by the
Keras-on-JAX benchmark for its measuring process. The settings are the JAX
engine's own CPU default (``tpudash.accel.jaxdetect.cpu_split_environment``:
the split and XLA's thread pool sized for collectives).
"""

from __future__ import annotations

from collections.abc import Mapping

from tpudash.accel.jaxdetect import cpu_split_environment

DEVICES = 8


def stand_in_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the 8 host devices and XLA's pool size added (a value already there is kept)."""
    return cpu_split_environment(environ, DEVICES)
