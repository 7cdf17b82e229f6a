"""What a running Keras ``fit`` knows and passes no callback: its batch size and the tf.data dataset it reads.

Keras hands callbacks neither; its data adapter, a local of ``fit``
(``epoch_iterator.data_adapter``), holds both. Read from the calling frames,
once per ``fit``, and never raises: a Keras that keeps them elsewhere gives
None, and the caller says what it could not see.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any


def running_fit_adapter() -> Any:
    """The data adapter of the ``fit`` that is calling us (None when there is none on the stack)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        iterator = frame.f_locals.get("epoch_iterator") if frame.f_code.co_name == "fit" else None
        if iterator is not None:
            return getattr(iterator, "data_adapter", None)
        frame = frame.f_back
    return None


def adapter_batch_size(adapter: Any) -> int | None:
    """The global batch size, when the adapter knows it (arrays; datasets batched with a fixed size)."""
    try:
        size = adapter.batch_size
    except Exception:  # noqa: BLE001 - an adapter that cannot say
        return None
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def adapter_dataset(adapter: Any) -> tuple[Any, str]:
    """(the tf.data dataset the user handed ``fit``, "") or (None, why it cannot be judged)."""
    if adapter is None:
        return None, "the fit's data could not be seen"
    dataset = getattr(adapter, "_dataset", None)
    kind = type(adapter).__name__
    if kind == "TFDatasetAdapter" and dataset is not None:
        return dataset, ""
    if kind == "ArrayDataAdapter":
        return None, "data given as arrays: Keras builds the tf.data pipeline itself (prefetch included)"
    return None, f"data given as {kind.removesuffix('Adapter') or kind}, not a tf.data dataset"


def dataset_batch_size(dataset: Any) -> int | None:
    """The batch a tf.data dataset yields: its elements' static first dimension, else its last ``batch``'s size."""
    try:
        import tensorflow as tf

        first = tf.nest.flatten(dataset.element_spec)[0].shape
        if first.rank and first[0] is not None:
            return int(first[0])
        stage, hops = dataset, 0
        while stage is not None and hops < 64:  # bounded: a pipeline is a handful of stages
            size = getattr(stage, "_batch_size", None)
            if size is not None:
                value = int(size.numpy() if hasattr(size, "numpy") else size)
                return value if value > 0 else None
            stage, hops = getattr(stage, "_input_dataset", None), hops + 1
    except Exception:  # noqa: BLE001 - a dataset that cannot say: the batch stays unknown
        return None
    return None
