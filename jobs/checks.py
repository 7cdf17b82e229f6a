"""What the numeric checks share: the tolerance of a float product, the failure, small matrices in the log.

matmul checks every device against a NumPy reference; replica-matmul,
replica-dataset and all-reduce check every replica. A wrong result fails
the run through ``CheckFailed`` after the check's table is out.
"""

from __future__ import annotations

import math
from typing import Any

# Matrices up to this size are printed in the log: small enough to read.
PRINTED_SHAPE_LIMIT = 8
# Unit roundoff (half the machine epsilon) of each dtype's significand:
# 24 bits for float32, 8 for bfloat16, 11 for float16.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# Every backend accumulates these matmuls in float32 (TPU MXU, oneDNN/Eigen,
# cuBLAS with fp32 compute); the product is then rounded to the dtype.
ACCUMULATION_ROUNDOFF = 2.0**-24
# Head-room over the error model; on this CPU the worst relative errors seen
# are at most a sixth of the resulting tolerance for every dtype.
TOLERANCE_SAFETY = 4.0


class CheckFailed(RuntimeError):
    """A device or replica computed a wrong result; the run is recorded as failed.

    Raise it after ``ctx.keep_summary(summary)``: the failed run's record
    keeps the check's summary (which devices failed, errors, timings).
    """


def local_values(strategy: Any, distributed: Any) -> list:
    """Every replica's value of a ``tf.distribute`` result, in replica order, as NumPy."""
    return [value.numpy() for value in strategy.experimental_local_results(distributed)]


def relative_tolerance(dtype: str, k: int, reduced_float32_input_roundoff: float = 0.0) -> float:
    """Largest allowed max|C − C_ref| / max|C_ref| for a correct device.

    The product is rounded once to ``dtype`` (one unit roundoff); accumulating
    k float32 terms adds a random-walk error that grows like sqrt(k); float32
    inputs rounded by TensorFloat-32 add their own roundoff. The reference is
    built from the inputs already rounded to ``dtype``, so input rounding to
    bfloat16/float16 is not an error.
    """
    input_roundoff = reduced_float32_input_roundoff if dtype == "float32" else 0.0
    model = UNIT_ROUNDOFF[dtype] + input_roundoff + math.sqrt(k) * ACCUMULATION_ROUNDOFF
    return TOLERANCE_SAFETY * model


def format_matrix(matrix: Any) -> str:
    """A small matrix as nested lists; whole numbers without a decimal point."""
    rows = []
    for row in matrix:
        cells = []
        for value in row:
            value = float(value)
            cells.append(str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}")
        rows.append("[" + ", ".join(cells) + "]")
    return "[" + ", ".join(rows) + "]"
