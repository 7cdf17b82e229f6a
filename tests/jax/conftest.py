"""Tests of tpudash beside JAX: Keras on the JAX backend and plain JAX loops, in an environment without TensorFlow.

They run in their own virtual environment, as Colab's TPU runtime has it: the
base install, Keras and JAX, no TensorFlow (`.ci/run`: `pip install ".[jax,test]"`,
then `python -m pytest tests/jax`). The CPU stands in for a TPU board: XLA
splits it into 8 host devices (``tests.jax.stand_in``), set here before
anything imports JAX (read once, when its backend starts) and inherited by
the processes the tests start. In an environment without JAX every test
here is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.jax.stand_in import stand_in_environment

os.environ.update(stand_in_environment(os.environ))
os.environ["KERAS_BACKEND"] = "jax"
# No accelerator is looked for: this machine has none, and JAX would warn about each.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

JAX_MISSING = importlib.util.find_spec("jax") is None or importlib.util.find_spec("keras") is None


def pytest_collection_modifyitems(config, items):
    if not JAX_MISSING:
        return
    skip = pytest.mark.skip(reason='JAX or Keras is not installed here: these run in `pip install ".[jax,test]"`')
    for item in items:
        if "tests/jax/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
