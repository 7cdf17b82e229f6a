"""Walk a tf.data dataset's graph, without running it, and judge the six pipeline rules.

The dataset is serialised once through ``tf.raw_ops.DatasetToGraphV2`` (the
public raw op behind tf.data's checkpointing and service) into a GraphDef;
its dataset nodes, followed from the ``_Retval`` back to the source, give the
stages in order, and the graph's function library holds the user functions
of ``map``/``interleave``. TensorFlow is imported inside functions only, so
importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tpudash.advice.rules import Advice, not_checked

PIPELINE_RULES = ("prefetch", "map-parallel", "cache", "shuffle-after-repeat", "interleave-parallel", "py-function")
# "Small" data for the cache rule: a source held in memory whose tensors total
# at most this much. Caching it costs no more host RAM than the constants the
# graph already holds, and anything of this size is read far faster from the
# cache than re-sliced and re-mapped each epoch; larger or file-backed sources
# are not judged (their size is not known without reading them).
CACHE_BOUND_BYTES = 1 << 30
# Ops that wrap a pipeline's end without being a stage a user wrote.
_WRAPPERS = {
    "OptionsDataset",
    "ModelDataset",
    "OptimizeDataset",
    "OptimizeDatasetV2",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
}
_PY_OPS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}
# File-reading ops: a pipeline that reads files has a size not known from its graph.
_FILE_WORDS = ("Record", "TextLine", "Reader", "MatchingFiles", "ListFiles", "Snapshot", "LoadDataset")
_IN_MEMORY_SOURCES = {"TensorSliceDataset", "TensorDataset"}
_FIX = {
    "prefetch": "dataset = dataset.prefetch(tf.data.AUTOTUNE)  # last",
    "map-parallel": "dataset = dataset.map(f, num_parallel_calls=tf.data.AUTOTUNE)",
    "cache": "dataset = dataset.cache()  # after the map, before shuffle/repeat",
    "shuffle-after-repeat": "dataset = dataset.shuffle(n).repeat()  # shuffle before repeat",
    "interleave-parallel": "dataset = dataset.interleave(f, num_parallel_calls=tf.data.AUTOTUNE)",
    "py-function": "rewrite the mapped function in TensorFlow ops (vectorised), without tf.py_function",
}


@dataclass(frozen=True)
class Stage:
    """One dataset node: its op, its position from the source (0) and the functions it calls."""

    op: str
    index: int
    functions: tuple[str, ...]
    source_bytes: int | None = None

    @property
    def name(self) -> str:
        return f"{self.op} (stage {self.index})"


def dataset_graph(dataset: Any) -> Any:
    """The dataset's GraphDef, through DatasetToGraphV2; external state (py_function) is tolerated."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    serialized = tf.raw_ops.DatasetToGraphV2(
        input_dataset=dataset._variant_tensor, external_state_policy=1, strip_device_assignment=True
    )
    return graph_pb2.GraphDef.FromString(serialized.numpy())


def _const_bytes(node: Any) -> int:
    import tensorflow as tf

    tensor = node.attr["value"].tensor
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= max(int(dim.size), 0)
    return count * tf.dtypes.as_dtype(tensor.dtype).size


def _consts(nodes: dict[str, Any], node: Any) -> list[Any]:
    """The constants feeding a source node, through Identity nodes."""
    found = []
    for name in (i.split(":")[0] for i in node.input if not i.startswith("^")):
        feeder = nodes.get(name)
        while feeder is not None and feeder.op == "Identity" and feeder.input:
            feeder = nodes.get(feeder.input[0].split(":")[0])
        if feeder is not None and feeder.op == "Const":
            found.append(feeder)
    return found


def stages(graph: Any) -> list[Stage]:
    """The dataset stages from source to output (the chain through each node's first input)."""
    nodes = {n.name: n for n in graph.node}
    out = next((n for n in graph.node if n.op == "_Retval"), None)
    chain = []
    current = nodes.get(out.input[0].split(":")[0]) if out is not None and out.input else None
    while current is not None and "Dataset" in current.op:
        chain.append(current)
        first = next((i for i in current.input if not i.startswith("^")), None)
        parent = nodes.get(first.split(":")[0]) if first else None
        current = parent if parent is not None and "Dataset" in parent.op else None
    chain.reverse()
    result = []
    for index, node in enumerate(chain):
        funcs = tuple(v.func.name for v in node.attr.values() if v.HasField("func"))
        size = None
        if node.op in _IN_MEMORY_SOURCES:
            size = sum(_const_bytes(c) for c in _consts(nodes, node))
        result.append(Stage(node.op, index, funcs, size))
    return result


def _calls_python(graph: Any, name: str, seen: set[str] | None = None) -> bool:
    """Whether a library function, or one it calls, runs a py_function/numpy_function."""
    return _calls(graph, name, lambda op: op in _PY_OPS, seen)


def _reads_files(op: str) -> bool:
    return any(word in op for word in _FILE_WORDS)


def _calls(graph: Any, name: str, matches: Any, seen: set[str] | None = None) -> bool:
    """Whether a library function, or one it calls, holds an op that ``matches``."""
    seen = seen if seen is not None else set()
    if name in seen:
        return False
    seen.add(name)
    library = {f.signature.name: f for f in graph.library.function}
    function = library.get(name)
    if function is None:
        return False
    for node in function.node_def:
        if matches(node.op):
            return True
        called = [v.func.name for v in node.attr.values() if v.HasField("func")]
        if node.op in library:
            called.append(node.op)
        if any(_calls(graph, c, matches, seen) for c in called):
            return True
    return False


def _fires(rule: str, stage: Stage, summary: str, **detail: Any) -> Advice:
    return Advice(rule, "fires", summary, _FIX[rule], {"stage": stage.name, **detail})


def judge(graph: Any) -> list[Advice]:
    """The six pipeline rules from a dataset GraphDef."""
    chain = stages(graph)
    if not chain:
        return [not_checked(r, "no dataset stages found") for r in PIPELINE_RULES]
    ops = [s.op for s in chain]
    detail = {"stages": " → ".join(ops)}
    found: list[Advice] = []

    user = [s for s in chain if s.op not in _WRAPPERS]
    last = user[-1]
    if last.op.startswith("Prefetch"):
        found.append(Advice("prefetch", "quiet", "the pipeline ends with prefetch", detail=detail))
    else:
        found.append(_fires("prefetch", last, f"no prefetch at the end (last stage: {last.name})", **detail))

    serial_maps = [s for s in chain if s.op == "MapDataset"]
    if serial_maps:
        found.append(_fires("map-parallel", serial_maps[0], f"map without num_parallel_calls: {serial_maps[0].name}"))
    else:
        found.append(Advice("map-parallel", "quiet", "every map runs in parallel (or there is none)"))

    source = chain[0]
    if any(s.op.startswith("CacheDataset") for s in chain):
        found.append(Advice("cache", "quiet", "the pipeline caches"))
    elif reader := next(
        (s for s in chain if _reads_files(s.op) or any(_calls(graph, f, _reads_files) for f in s.functions)), None
    ):
        found.append(not_checked("cache", f"{reader.name} reads files (TFRecordDataset etc.): size unknown"))
    elif source.source_bytes is None:
        found.append(not_checked("cache", f"size of the source {source.name} unknown without reading it"))
    elif source.source_bytes > CACHE_BOUND_BYTES:
        found.append(
            Advice(
                "cache",
                "quiet",
                "the source is too large to cache in memory",
                detail={"source_bytes": source.source_bytes},
            )
        )
    else:
        found.append(
            _fires(
                "cache",
                source,
                f"small data ({source.source_bytes / 2**20:.1f} MiB) is not cached",
                source_bytes=source.source_bytes,
            )
        )

    repeat = next((s for s in chain if s.op == "RepeatDataset"), None)
    late_shuffle = next(
        (s for s in chain if s.op.startswith("ShuffleDataset") and repeat and s.index > repeat.index), None
    )
    if late_shuffle is not None:
        found.append(_fires("shuffle-after-repeat", late_shuffle, f"shuffle after repeat: {late_shuffle.name}"))
    else:
        found.append(Advice("shuffle-after-repeat", "quiet", "no shuffle after repeat"))

    serial_interleave = next((s for s in chain if s.op == "InterleaveDataset"), None)
    if serial_interleave is not None:
        found.append(
            _fires(
                "interleave-parallel",
                serial_interleave,
                f"interleave without num_parallel_calls: {serial_interleave.name}",
            )
        )
    else:
        found.append(Advice("interleave-parallel", "quiet", "every interleave runs in parallel (or there is none)"))

    python = next((s for s in chain if any(_calls_python(graph, f) for f in s.functions)), None)
    if python is not None:
        found.append(_fires("py-function", python, f"py_function/numpy_function in {python.name} holds the GIL"))
    else:
        found.append(Advice("py-function", "quiet", "no Python functions in the pipeline"))
    return found


def advise_pipeline(dataset: Any) -> list[Advice]:
    """The six pipeline rules for a tf.data dataset; "not checked" with why when it cannot be walked."""
    if dataset is None or not hasattr(dataset, "_variant_tensor"):
        return [not_checked(r, "no tf.data dataset seen") for r in PIPELINE_RULES]
    try:
        graph = dataset_graph(dataset)
    except Exception as exc:  # a dataset TF cannot serialise: say so rather than crash the run
        return [not_checked(r, f"dataset graph unreadable: {type(exc).__name__}") for r in PIPELINE_RULES]
    return judge(graph)


def rule_ids(advice: Iterable[Advice]) -> list[str]:
    return [a.rule for a in advice if a.state == "fires"]
