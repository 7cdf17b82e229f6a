"""Walk a tf.data dataset's Python objects, without running or serialising it, and judge the six pipeline rules.

Every ``tf.data.Dataset`` keeps its inputs (``_inputs()``) and its user
functions (``_functions()``: ``StructuredFunctionWrapper``s whose
``.function`` is a traced ConcreteFunction), and each transformation is a
class of its own (``_MapDataset``, ``_ParallelMapDataset``,
``_PrefetchDataset`` …). Walking those objects costs microseconds whatever
the data size; serialising the dataset (``DatasetToGraphV2``) would copy every
constant: 0.7–1 s for 60,000 MNIST-size examples, paid at every run's start.
The user functions are read from their traced graphs (op types only), the
source's size from its element tensors' shapes and dtypes. A dataset wrapped
by distribution (``strategy.experimental_distribute_dataset`` →
``DistributedDataset``, or ``distribute_datasets_from_function``) is opened
to the user's own pipeline. What cannot be walked makes the rules it could
change "not checked: <why>"; nothing here raises, and nothing imports
TensorFlow (the objects are read as they are).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tpudash.advice.rules import Advice, not_checked

PIPELINE_RULES = ("prefetch", "map-parallel", "cache", "shuffle-after-repeat", "interleave-parallel", "py-function")
# "Small" data for the cache rule: a source held in memory whose tensors total
# at most this much. Caching it costs no more host RAM than the tensors the
# dataset already holds, and anything of this size is read far faster from the
# cache than re-sliced and re-mapped each epoch; larger or file-backed sources
# are not judged (their size is not known without reading them).
CACHE_BOUND_BYTES = 1 << 30
# Stages that wrap a pipeline's end without being a stage a user wrote (options,
# and what distribution puts around a dataset it shards or rebatches).
_WRAPPERS = {
    "OptionsDataset",
    "ModelDataset",
    "OptimizeDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
    "AutoShardDataset",
    "RebatchDataset",
    "LegacyRebatchDataset",
}
_PY_OPS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}
# File-reading stages (class names) and ops (in user functions, e.g. an interleave
# opening TFRecordDatasets): a pipeline that reads files has a size not known
# without reading them. Compared lower-case.
_FILE_WORDS = (
    "record",
    "textline",
    "reader",
    "matchingfiles",
    "listfiles",
    "snapshot",
    "loaddataset",
    "csvdataset",
    "sqldataset",
)
# Sources whose elements are tensors held in the dataset object (``_tensors``).
_IN_MEMORY_SOURCES = {"TensorSliceDataset", "TensorDataset"}
# Stages that only hold a tf.data variant: nothing behind them can be walked.
_OPAQUE = {"VariantDataset"}
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
    """One dataset stage: its kind (the class, e.g. "MapDataset"), its position (sources first) and what it holds.

    ``function_ops`` are the op types of its user functions and of every function
    they call (None: a function whose ops could not be read); ``unwalkable`` says
    why nothing behind this stage could be read (None: walked).
    """

    kind: str
    index: int
    function_ops: frozenset[str] | None = frozenset()
    source_bytes: int | None = None
    after_repeat: bool = False
    is_source: bool = False
    unwalkable: str | None = None

    @property
    def name(self) -> str:
        return f"{self.kind} (stage {self.index})"

    @property
    def reads_files(self) -> bool:
        return _reads_files(self.kind) or any(_reads_files(op) for op in self.function_ops or ())


@dataclass(frozen=True)
class Pipeline:
    """The walked dataset: every stage (inputs before the stages that read them) and the main chain.

    The chain follows each stage's first input from the end back to its source,
    so ``chain[-1]`` is what the model is fed and ``chain[0]`` the main source.
    """

    stages: tuple[Stage, ...]
    chain: tuple[Stage, ...]


def _reads_files(kind: str) -> bool:
    lowered = kind.lower()
    return any(word in lowered for word in _FILE_WORDS)


def user_dataset(dataset: Any) -> tuple[Any, str | None]:
    """The tf.data dataset a user built, out of the wrappers around it; (None, why) when there is none."""
    for _ in range(8):  # a few nested wrappers at most; never loop on a strange object
        if dataset is None:
            return None, "no tf.data dataset seen"
        kind = type(dataset).__name__
        if getattr(dataset, "_original_dataset", None) is not None:  # DistributedDataset from a dataset
            dataset = dataset._original_dataset
        elif kind == "DatasetV1Adapter" and hasattr(dataset, "_dataset"):
            dataset = dataset._dataset
        elif kind.startswith("Distributed"):  # from a function, or from components: the first worker's copy
            copies = getattr(dataset, "_datasets", None) or getattr(dataset, "_cloned_datasets", None)
            if not copies:
                return None, f"a {kind} not built yet: its datasets cannot be walked"
            dataset = copies[0]
        elif _is_dataset(dataset):
            return dataset, None
        else:
            return None, f"no tf.data dataset seen (got {kind})"
    return None, f"no tf.data dataset inside the {type(dataset).__name__} wrappers"


def _is_dataset(value: Any) -> bool:
    return callable(getattr(value, "_inputs", None)) and hasattr(type(value), "element_spec")


def _kind(dataset: Any) -> str:
    return type(dataset).__name__.lstrip("_")


def _inputs(dataset: Any) -> list[Any] | None:
    """The stage's input datasets (each out of its V1 adapter); None when they cannot be read."""
    if _kind(dataset) in _OPAQUE:
        return None
    if _reads_files(_kind(dataset)) and hasattr(dataset, "_impl"):
        # A reader (TFRecordDatasetV2 …) is one stage: its inside is tf.data's own file name plumbing.
        return []
    try:
        found = list(dataset._inputs())
    except Exception:  # noqa: BLE001 - a dataset class that does not list its inputs
        return None
    unwrapped = []
    for item in found:
        while type(item).__name__ == "DatasetV1Adapter" and hasattr(item, "_dataset"):
            item = item._dataset
        unwrapped.append(item)
    return unwrapped


def _graph_ops(graph: Any) -> tuple[list[str], list[Any]]:
    """A FuncGraph's op types and the functions its library holds (what its calls and branches run)."""
    types = [op.type for op in graph.get_operations()]
    return types, list(getattr(graph, "_functions", {}).values())


def function_ops(functions: Iterable[Any]) -> frozenset[str] | None:
    """The op types of these user functions and of every function they call; None if one cannot be read.

    A traced function's graph is read as it is (no serialisation); a library
    function without one gives its FunctionDef (that one function's ops only,
    never the dataset's tensors).
    """
    types: set[str] = set()
    pending = [getattr(f, "function", f) for f in functions]
    seen: set[int] = set()
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        if hasattr(function, "_cached_graph"):
            # An AtomicFunction: its traced graph when it has one; its .graph would otherwise be
            # rebuilt from the FunctionDef, so the FunctionDef itself is read below.
            graph = function._cached_graph
        else:
            graph = getattr(function, "graph", None)  # a ConcreteFunction (or a legacy Defun)
        if graph is not None and hasattr(graph, "get_operations"):
            found, called = _graph_ops(graph)
            types.update(found)
            pending.extend(called)
            continue
        definition = getattr(function, "cached_definition", None) or getattr(function, "definition", None)
        if definition is None or not hasattr(definition, "node_def"):
            return None
        types.update(node.op for node in definition.node_def)
        pending.extend(getattr(function, "children", ()))
    return frozenset(types)


def _source_bytes(dataset: Any) -> int | None:
    """The byte size of an in-memory source's element tensors, from their shapes and dtypes; None when unknown."""
    tensors = getattr(dataset, "_tensors", None)
    if not tensors:
        return None
    total = 0
    for tensor in tensors:
        count = tensor.shape.num_elements()
        if count is None or tensor.dtype.name == "variant":  # sparse and ragged slices: sizes behind the variant
            return None
        total += count * tensor.dtype.size  # strings count 0, as their size is not in the shape
    return total


def walk(dataset: Any) -> Pipeline:
    """Every stage of a tf.data dataset, inputs before the stages that read them, and its main chain."""
    stages: dict[int, Stage] = {}
    order: list[Stage] = []
    first_input: dict[int, int] = {}
    # Depth first, iterative (pipelines can be long): a stage is numbered once all its inputs are.
    pending: list[tuple[Any, bool]] = [(dataset, False)]
    entered: set[int] = set()  # never loop, whatever a strange object lists as its inputs
    while pending:
        current, inputs_done = pending.pop()
        key = id(current)
        if key in stages or (not inputs_done and key in entered):
            continue
        inputs = _inputs(current)
        if not inputs_done:
            entered.add(key)
            pending.append((current, True))
            pending.extend((item, False) for item in reversed(inputs or []) if id(item) not in stages)
            continue
        kind = _kind(current)
        try:
            functions = list(current._functions())
        except Exception:  # noqa: BLE001 - a class without user functions to list
            functions = []
        upstream = [stages[id(item)] for item in inputs or [] if id(item) in stages]
        stage = Stage(
            kind=kind,
            index=len(order),
            function_ops=function_ops(functions),
            source_bytes=_source_bytes(current) if kind in _IN_MEMORY_SOURCES else None,
            after_repeat=any(s.kind == "RepeatDataset" or s.after_repeat for s in upstream),
            is_source=inputs == [],
            unwalkable=None
            if inputs is not None
            else f"{kind} (stage {len(order)}) cannot be walked: it holds a bare variant",
        )
        stages[key] = stage
        order.append(stage)
        if inputs:
            first_input[key] = id(inputs[0])
    chain = []
    link: int | None = id(dataset)
    while link is not None:
        chain.append(stages[link])
        link = first_input.get(link)
    chain.reverse()
    return Pipeline(tuple(order), tuple(chain))


def _fires(rule: str, stage: Stage, summary: str, **detail: Any) -> Advice:
    return Advice(rule, "fires", summary, _FIX[rule], {"stage": stage.name, **detail})


def _presence_rule(rule: str, found: Stage | None, fired: str, quiet: str, unwalked: Stage | None) -> Advice:
    """A rule that fires on a stage found anywhere: quiet only when every stage was seen."""
    if found is not None:
        return _fires(rule, found, fired)
    if unwalked is not None:
        return not_checked(rule, unwalked.unwalkable or unwalked.name)
    return Advice(rule, "quiet", quiet)


def _cache_rule(pipeline: Pipeline, unwalked: Stage | None) -> Advice:
    if any(s.kind.startswith("CacheDataset") for s in pipeline.stages):
        return Advice("cache", "quiet", "the pipeline caches")
    if reader := next((s for s in pipeline.stages if s.reads_files), None):
        return not_checked("cache", f"{reader.name} reads files (TFRecordDataset etc.): size unknown")
    if unwalked is not None:
        return not_checked("cache", unwalked.unwalkable or unwalked.name)
    # Every source counts (a zip of two in-memory sources caches both); one of unknown size leaves it open.
    sources = [s for s in pipeline.stages if s.is_source]
    unknown = next((s for s in sources if s.source_bytes is None), None)
    if unknown is not None:
        return not_checked("cache", f"size of the source {unknown.name} unknown without reading it")
    size = sum(s.source_bytes or 0 for s in sources)
    if size > CACHE_BOUND_BYTES:
        return Advice("cache", "quiet", "the source is too large to cache in memory", detail={"source_bytes": size})
    return _fires("cache", pipeline.chain[0], f"small data ({size / 2**20:.1f} MiB) is not cached", source_bytes=size)


def judge(pipeline: Pipeline) -> list[Advice]:
    """The six pipeline rules from a walked dataset."""
    detail = {"stages": " → ".join(s.kind for s in pipeline.stages)}
    unwalked = next((s for s in pipeline.stages if s.unwalkable), None)
    found: list[Advice] = []

    user = [s for s in pipeline.chain if s.kind not in _WRAPPERS] or list(pipeline.chain)
    last = user[-1]
    if last.kind.startswith("PrefetchDataset"):
        found.append(Advice("prefetch", "quiet", "the pipeline ends with prefetch", detail=detail))
    elif last.unwalkable:
        found.append(not_checked("prefetch", last.unwalkable))
    else:
        found.append(_fires("prefetch", last, f"no prefetch at the end (last stage: {last.name})", **detail))

    serial_map = next((s for s in pipeline.stages if s.kind == "MapDataset"), None)
    found.append(
        _presence_rule(
            "map-parallel",
            serial_map,
            f"map without num_parallel_calls: {serial_map.name if serial_map else ''}",
            "every map runs in parallel (or there is none)",
            unwalked,
        )
    )

    found.append(_cache_rule(pipeline, unwalked))

    late_shuffle = next((s for s in pipeline.stages if s.kind.startswith("ShuffleDataset") and s.after_repeat), None)
    found.append(
        _presence_rule(
            "shuffle-after-repeat",
            late_shuffle,
            f"shuffle after repeat: {late_shuffle.name if late_shuffle else ''}",
            "no shuffle after repeat",
            unwalked,
        )
    )

    serial_interleave = next((s for s in pipeline.stages if s.kind == "InterleaveDataset"), None)
    found.append(
        _presence_rule(
            "interleave-parallel",
            serial_interleave,
            f"interleave without num_parallel_calls: {serial_interleave.name if serial_interleave else ''}",
            "every interleave runs in parallel (or there is none)",
            unwalked,
        )
    )

    python = next((s for s in pipeline.stages if s.function_ops and s.function_ops & _PY_OPS), None)
    unread = next((s for s in pipeline.stages if s.function_ops is None), None)
    if python is None and unwalked is None and unread is not None:
        found.append(not_checked("py-function", f"the functions of {unread.name} cannot be read"))
    else:
        found.append(
            _presence_rule(
                "py-function",
                python,
                f"py_function/numpy_function in {python.name if python else ''} holds the GIL",
                "no Python functions in the pipeline",
                unwalked,
            )
        )
    return found


def stages(dataset: Any) -> list[Stage]:
    """The main chain of a dataset's stages, source first (each stage's first input back from the end)."""
    inner, _why = user_dataset(dataset)
    return [] if inner is None else list(walk(inner).chain)


def advise_pipeline(dataset: Any) -> list[Advice]:
    """The six pipeline rules for a tf.data dataset; "not checked" with why when it cannot be walked. Never raises."""
    try:
        inner, why = user_dataset(dataset)
        if inner is None:
            return [not_checked(r, why or "no tf.data dataset seen") for r in PIPELINE_RULES]
        return judge(walk(inner))
    except Exception as exc:  # noqa: BLE001 - a dataset this walk does not know: say so rather than crash the run
        return [not_checked(r, f"dataset walk failed: {type(exc).__name__}: {exc}"[:200]) for r in PIPELINE_RULES]


def rule_ids(advice: Iterable[Advice]) -> list[str]:
    return [a.rule for a in advice if a.state == "fires"]
