"""The ``dtensor-mlp`` job: the DTensor MNIST example's data-parallel MLP on a DTensor mesh.

A one-dimensional mesh ``[("batch", N)]`` over the runtime's N logical
devices; every weight is replicated (``UNSHARDED`` on both axes), every
input batch is split along the batch axis with ``dtensor.pack``, so each
device trains on its shard and DTensor reduces the gradients: the same
arithmetic as MirroredStrategy, written with the TensorFlow Core API.

The model is the one the example meant to build, 784→700→500→10 with ReLU (the
page overwrites a variable and builds 784→700→10→10 by mistake), with Xavier
uniform weights from stateless seeds, zero biases and the example's hand-written
Adam. One change: the example's Adam keeps its step count in a Python float,
which ``tf.function`` freezes at trace time, so its bias correction never
advances; here the count is a replicated DVariable. And the update uses the new
moments as computed, not read back from their DVariables, which inside the train
step's ``tf.function`` gave the previous step's moments.

Data come from jobs.datasets (tfds or synthetic), the example's defaults: the first
5000 training and test examples, global batch 128, 3 epochs. Reports
per-batch training loss, per-epoch train and test loss and accuracy
(``EpochReports``), and two tables of what is where: each layer's layout and
the part of it one device holds (``layer_table``), and each device's place
on the mesh, examples per batch and weights held (``device_table``), read from
the DVariables' own components.

On JAX (``jobs.on_jax.dtensor_mlp``) the same MLP trains on a (batch, model)
mesh with ``NamedSharding``; data, step plan, tables, events and summary are
this module's.
"""

from __future__ import annotations

import math
from typing import Any

from jobs import datasets as data
from jobs.base import JobSpec, Param, ParamError
from jobs.events import Metric, Progress, Table
from jobs.hostmemory import available_host_bytes, format_gib

PARAMS = (
    Param("dataset", "str", "mnist", "images to classify (flattened into the input layer)", choices=data.DATASET_NAMES),
    Param(
        "source",
        "str",
        "tfds",
        "tfds: the real data; synthetic: a learnable stand-in of the same shapes",
        choices=data.SOURCES,
    ),
    Param(
        "hidden",
        "ints",
        (700, 500),
        "sizes of the hidden ReLU layers (the DTensor MNIST example: 700,500)",
        minimum=1,
        maximum=65_536,
    ),
    Param("epochs", "int", 3, "passes over the training examples", minimum=1, maximum=100_000),
    Param("batch_size", "int", 128, "global batch, split over the mesh's batch axis", minimum=1, maximum=1 << 20),
    Param("learning_rate", "float", 0.001, "Adam step size", minimum=0.0, maximum=10.0, minimum_exclusive=True),
    Param(
        "limit_train",
        "int",
        5000,
        "use the first N training examples (0 = all; the example uses 5000)",
        minimum=0,
        maximum=10_000_000,
    ),
    Param(
        "limit_test",
        "int",
        5000,
        "use the first N test examples (0 = all; the example uses 5000)",
        minimum=0,
        maximum=10_000_000,
    ),
    Param(
        "seed", "int", 22, "seed of the weights and the shuffling (the example uses 22)", minimum=0, maximum=2**31 - 1
    ),
)


class DTensorUnavailable(RuntimeError):
    """DTensor cannot build a mesh on this runtime; the message says why."""


# Weights, their gradients and Adam's two moments, float32.
BYTES_PER_PARAMETER = 4 * 4


def parameter_count(input_size: int, hidden: tuple, classes: int) -> int:
    sizes = [input_size, *hidden, classes]
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes, sizes[1:]))


def check_memory(params: dict, runtime: Any, available_host: int | None = None) -> None:
    """ParamError on ``hidden`` when the replicated weights cannot fit in host memory.

    The mesh shards the batch and replicates the layers: on logical CPU
    devices every device's copy lives in the host's memory.
    """
    if getattr(runtime, "kind", "CPU") != "CPU":
        return
    shape = data.DATASETS[params["dataset"]]
    count = parameter_count(math.prod(shape.image_shape), tuple(params["hidden"]), shape.num_classes)
    devices = len(runtime.logical_devices) or int(runtime.num_replicas)
    needed = count * BYTES_PER_PARAMETER * devices
    available = available_host_bytes() if available_host is None else available_host
    if available is not None and needed > available:
        raise ParamError(
            "hidden",
            f"{','.join(map(str, params['hidden']))} makes {count:,} parameters; replicated on {devices} devices "
            f"with gradients and Adam state that needs {format_gib(needed)} of host memory, "
            f"{format_gib(available)} available; use smaller layers",
        )


def check_runtime(params: dict, runtime: Any) -> None:
    check_memory(params, runtime)
    devices = len(runtime.logical_devices) or int(runtime.num_replicas)
    if params["batch_size"] % devices:
        raise ParamError(
            "batch_size",
            f"{params['batch_size']} does not split evenly over the mesh's {devices} devices; "
            f"allowed: a multiple of {devices}",
        )
    for name in ("limit_train", "limit_test"):
        if params[name] and params[name] < params["batch_size"]:
            raise ParamError(
                name,
                f"{params[name]} is fewer than one batch of {params['batch_size']}; "
                f"allowed: 0 (all) or >= {params['batch_size']}",
            )


def make_mesh(runtime: Any):
    """``dtensor.create_mesh([("batch", N)])`` over the runtime's logical devices."""
    try:
        from tensorflow.experimental import dtensor
    except ImportError as error:  # pragma: no cover - every TF 2.9+ ships it
        raise DTensorUnavailable(f"this TensorFlow has no tf.experimental.dtensor ({error})") from error
    names = [device.name for device in runtime.logical_devices]
    if not names:
        raise DTensorUnavailable("the runtime lists no logical devices to put a DTensor mesh on")
    try:
        return dtensor, dtensor.create_mesh([("batch", len(names))], devices=names, device_type=runtime.kind)
    except Exception as error:  # noqa: BLE001 - any failure here means "no DTensor on this runtime"
        raise DTensorUnavailable(_unavailable_text(runtime, "build a mesh over", error)) from error


def _unavailable_text(runtime: Any, what: str, error: BaseException) -> str:
    hint = (
        " DTensor on a TPU needs a TPU VM and dtensor.initialize_accelerator_system('TPU'), which cannot "
        "share the TPU with the TPUStrategy tpudash has already initialized; the train job runs there."
        if runtime.kind == "TPU"
        else ""
    )
    count = len(runtime.logical_devices)
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": .")
    return f"DTensor cannot {what} this runtime's {count} {runtime.kind} devices ({reason}).{hint}"


def build_mlp(runtime: Any, dtensor, mesh, sizes: list[int], seed: int) -> MLP:
    """The MLP with replicated weights on ``mesh``; DTensorUnavailable if they cannot be placed."""
    import tensorflow as tf

    weight_layout = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)
    try:
        return MLP(
            [
                DenseLayer(
                    dtensor,
                    sizes[index],
                    sizes[index + 1],
                    weight_layout,
                    activation=tf.nn.relu if index < len(sizes) - 2 else tf.identity,
                    seed=(seed, index + 23),
                )
                for index in range(len(sizes) - 1)
            ]
        )
    except Exception as error:  # noqa: BLE001 - a mesh that cannot hold variables is no DTensor runtime
        raise DTensorUnavailable(_unavailable_text(runtime, "place replicated variables on", error)) from error


def load_data(ctx: Any, params: dict, tf_data: bool = True) -> tuple[data.Splits, list[int], int, int]:
    """The splits (as ``jobs.datasets`` makes them), the layer sizes, and full batches per epoch of train and test."""
    runtime = ctx.runtime
    source = (
        params["source"] if tf_data else data.source_here(params["source"], data.DATASETS[params["dataset"]], ctx.log)
    )
    splits = data.load_splits(
        params["dataset"],
        source,
        data_dir=getattr(ctx.settings, "data_dir", None),
        try_gcs=runtime.kind == "TPU",
        limit_train=params["limit_train"],
        limit_test=params["limit_test"],
        seed=params["seed"],
        log=ctx.log,
        advise_param=ctx.advise_param,
        tf_data=tf_data,
    )
    ctx.raise_if_cancelled()
    batch_size = params["batch_size"]
    sizes = [math.prod(splits.shape.image_shape), *params["hidden"], splits.shape.num_classes]
    train_steps = splits.train_examples // batch_size
    test_steps = splits.test_examples // batch_size
    if train_steps < 1 or test_steps < 1:
        raise data.DatasetUnavailable(
            f"{splits.train_examples} train / {splits.test_examples} test examples do not fill one batch of "
            f"{batch_size}; lower batch_size"
        )
    return splits, sizes, train_steps, test_steps


def layer_table(title: str, sizes: list[int], layouts: list[str], held: list[str]) -> Table:
    """Each layer: its shape, how its weights are laid out on the mesh, what one device holds of them, params."""
    layers = list(zip(sizes, sizes[1:]))
    total = sum(fan_in * fan_out + fan_out for fan_in, fan_out in layers)
    return Table(
        title=title,
        columns=["layer", "shape", "layout", "params", "each device holds"],
        rows=[
            *[
                [f"dense {index + 1}", f"{fan_in}→{fan_out}", layout, fan_in * fan_out + fan_out, holds]
                for index, ((fan_in, fan_out), layout, holds) in enumerate(zip(layers, layouts, held))
            ],
            ["total", "", "", total, ""],
        ],
    )


def held_text(kernel_shape, bias_shape) -> str:
    """``784×350 + 350``: the part of a layer's kernel and bias one device holds."""
    return "×".join(str(int(size)) for size in kernel_shape) + " + " + "×".join(str(int(size)) for size in bias_shape)


def device_table(mesh_text: str, rows: list[list]) -> Table:
    """One row per device: its place on the mesh, the examples of each batch it computes, the weights it holds."""
    return Table(
        title=f"what each device holds on the mesh {mesh_text}",
        columns=["device", "mesh position", "examples per batch", "weights held", "weight bytes"],
        rows=rows,
    )


class EpochReports:
    """The per-batch and per-epoch events and the history of a run, the same on TensorFlow and JAX."""

    def __init__(self, ctx: Any, epochs: int, train_steps: int):
        self.ctx = ctx
        self.epochs = epochs
        self.train_steps = train_steps
        self.global_step = 0
        self.history: dict[str, list[float]] = {
            "train_loss": [],
            "train_accuracy": [],
            "test_loss": [],
            "test_accuracy": [],
        }
        self.losses: list[float] = []
        self.accuracies: list[float] = []
        self.test_losses: list[float] = []
        self.test_accuracies: list[float] = []
        ctx.progress(0, epochs, "epoch")

    def begin_epoch(self) -> None:
        self.losses, self.accuracies, self.test_losses, self.test_accuracies = [], [], [], []

    def batch(self, epoch: int, step: int, loss: float, accuracy: float) -> None:
        self.global_step += 1
        self.losses.append(loss)
        self.accuracies.append(accuracy)
        self.ctx.emit(Metric("batch_loss", loss, self.global_step, epoch, "train"))
        self.ctx.progress(step, self.train_steps, "step")
        self.ctx.raise_if_cancelled()

    def test_batch(self, loss: float, accuracy: float) -> None:
        self.test_losses.append(loss)
        self.test_accuracies.append(accuracy)
        self.ctx.raise_if_cancelled()

    def end_epoch(self, epoch: int) -> None:
        epoch_values = {
            ("loss", "train"): sum(self.losses) / len(self.losses),
            ("accuracy", "train"): sum(self.accuracies) / len(self.accuracies),
            ("loss", "test"): sum(self.test_losses) / len(self.test_losses),
            ("accuracy", "test"): sum(self.test_accuracies) / len(self.test_accuracies),
        }
        for (name, split), value in epoch_values.items():
            self.history[f"{split}_{name}"].append(value)
            self.ctx.emit(Metric(name, value, self.global_step, epoch, split))
        self.ctx.log(
            f"epoch {epoch}: training loss {epoch_values[('loss', 'train')]:.3f}, accuracy "
            f"{epoch_values[('accuracy', 'train')]:.3f}; testing loss {epoch_values[('loss', 'test')]:.3f}, "
            f"accuracy {epoch_values[('accuracy', 'test')]:.3f}"
        )
        self.ctx.emit(Progress(epoch, self.epochs, "epoch"))

    def summary(self, splits: data.Splits, mesh_text: str, sizes: list[int], params_count: int) -> dict:
        return {
            "data": splits.label,
            "synthetic": splits.source == "synthetic",
            "mesh": mesh_text,
            "layers": sizes,
            "params": params_count,
            "steps": self.global_step,
            **{name: values[-1] for name, values in self.history.items()},
            "history": self.history,
        }


def run_dtensor_mlp(ctx: Any, params: dict) -> dict:
    import tensorflow as tf

    runtime = ctx.runtime
    dtensor, mesh = make_mesh(runtime)
    devices = mesh.num_local_devices()
    tf.random.set_seed(params["seed"])
    splits, sizes, train_steps, _ = load_data(ctx, params)
    batch_size = params["batch_size"]
    input_size = sizes[0]

    def flatten(images, labels):
        return tf.reshape(tf.cast(images, tf.float32) / 255.0, [-1, input_size]), labels

    # Full batches only: every shard of the batch axis must be the same size.
    train_data = data.without_tuning_thread(
        splits.train.cache()
        .shuffle(data.SHUFFLE_BUFFER, seed=params["seed"])
        .batch(batch_size, drop_remainder=True)
        .map(flatten, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    test_data = data.without_tuning_thread(
        splits.test.cache()
        .batch(batch_size, drop_remainder=True)
        .map(flatten, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )

    model = build_mlp(runtime, dtensor, mesh, sizes, params["seed"])
    layers = model.layers
    optimizer = Adam(dtensor, model.trainable_variables, learning_rate=params["learning_rate"])
    parameter_count = sum(int(tf.size(variable)) for variable in model.trainable_variables)
    mesh_text = f"batch={devices}"
    # What each device holds, read from the DTensors themselves: a replicated layer's every component is whole.
    held = [
        held_text(first_component(dtensor, layer.w).shape, first_component(dtensor, layer.b).shape) for layer in layers
    ]
    ctx.emit(
        layer_table(
            f"DTensor MLP on {splits.label}: {parameter_count:,} params, mesh {mesh_text}",
            sizes,
            ["replicated"] * len(layers),
            held,
        )
    )
    held_params = sum(int(tf.size(first_component(dtensor, variable))) for variable in model.trainable_variables)
    ctx.emit(
        device_table(
            mesh_text,
            [
                [name, f"batch {index}", batch_size // devices, held_params, held_params * 4]
                for index, name in enumerate(mesh.local_devices())
            ],
        )
    )
    ctx.log(
        f"DTensor data parallelism: mesh [('batch', {devices})] over {', '.join(mesh.local_devices()[:2])}"
        f"{', …' if devices > 2 else ''}; weights replicated, each batch of {batch_size} split into "
        f"{devices} shards of {batch_size // devices}; {' → '.join(map(str, sizes))} on {splits.label}, "
        f"{splits.train_examples:,} train / {splits.test_examples:,} test examples"
    )
    batch_layouts = (dtensor.Layout(["batch", dtensor.UNSHARDED], mesh), dtensor.Layout(["batch"], mesh))

    train_step = training_step(tf, model, optimizer)

    @tf.function
    def test_step(x_batch, y_batch):
        logits = model(x_batch)
        return cross_entropy_loss(tf, logits, y_batch), accuracy(tf, logits, y_batch)

    def pack(x_batch, y_batch):
        return (
            repack_local_tensor(dtensor, tf, x_batch, batch_layouts[0]),
            repack_local_tensor(dtensor, tf, y_batch, batch_layouts[1]),
        )

    reports = EpochReports(ctx, params["epochs"], train_steps)
    for epoch in range(1, params["epochs"] + 1):
        reports.begin_epoch()
        for step, (x_batch, y_batch) in enumerate(train_data, start=1):
            batch_loss, batch_accuracy = train_step(*pack(x_batch, y_batch))
            reports.batch(
                epoch, step, float(unpack_first(dtensor, batch_loss)), float(unpack_first(dtensor, batch_accuracy))
            )
        for x_batch, y_batch in test_data:
            batch_loss, batch_accuracy = test_step(*pack(x_batch, y_batch))
            reports.test_batch(float(unpack_first(dtensor, batch_loss)), float(unpack_first(dtensor, batch_accuracy)))
        reports.end_epoch(epoch)
    return reports.summary(splits, mesh_text, sizes, parameter_count)


class DenseLayer:
    """A dense layer whose weights are DVariables with ``weight_layout``, as in the DTensor MNIST example."""

    def __init__(self, dtensor, in_dim: int, out_dim: int, weight_layout, activation, seed: tuple[int, int]):
        import tensorflow as tf

        self.in_dim, self.out_dim = in_dim, out_dim
        self.activation = activation
        uniform_initializer = tf.function(tf.random.stateless_uniform)
        xavier_limit = math.sqrt(6.0) / math.sqrt(in_dim + out_dim)
        self.w = dtensor.DVariable(
            dtensor.call_with_layout(
                uniform_initializer,
                weight_layout,
                shape=(in_dim, out_dim),
                seed=seed,
                minval=-xavier_limit,
                maxval=xavier_limit,
            )
        )
        bias_layout = weight_layout.delete([0])
        self.b = dtensor.DVariable(dtensor.call_with_layout(tf.zeros, bias_layout, shape=[out_dim]))

    def __call__(self, x):
        import tensorflow as tf

        return self.activation(tf.add(tf.matmul(x, self.w), self.b))


class MLP:
    """Dense layers in sequence."""

    def __init__(self, layers: list[DenseLayer]):
        self.layers = layers

    @property
    def trainable_variables(self) -> list:
        return [variable for layer in self.layers for variable in (layer.w, layer.b)]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Adam:
    """The DTensor MNIST example's Adam over DVariables, with slots laid out like their variables."""

    def __init__(self, dtensor, model_vars, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        import tensorflow as tf

        self.model_vars = model_vars
        self.beta_1, self.beta_2 = beta_1, beta_2
        self.learning_rate = learning_rate
        self.epsilon = epsilon
        scalar_layout = dtensor.Layout([], model_vars[0].layout.mesh)
        self.t = dtensor.DVariable(dtensor.call_with_layout(tf.ones, scalar_layout, shape=[]))
        self.v_dvar, self.s_dvar = [], []
        for var in model_vars:
            self.v_dvar.append(dtensor.DVariable(dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape)))
            self.s_dvar.append(dtensor.DVariable(dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape)))

    def apply_gradients(self, grads) -> None:
        import tensorflow as tf

        for index, (d_var, var) in enumerate(zip(grads, self.model_vars)):
            # The new moments feed the update as tensors, not read back from their DVariables: in
            # the train step's tf.function (gradients and update in one) DTensor does not order a
            # read after the assignment, so the read saw the previous step's moments (zero at the
            # first step: no update at all), and the layers learnt late and slowly.
            v_new = self.beta_1 * self.v_dvar[index] + (1 - self.beta_1) * d_var
            s_new = self.beta_2 * self.s_dvar[index] + (1 - self.beta_2) * tf.square(d_var)
            self.v_dvar[index].assign(v_new)
            self.s_dvar[index].assign(s_new)
            v_corrected = v_new / (1 - self.beta_1**self.t)
            s_corrected = s_new / (1 - self.beta_2**self.t)
            var.assign_sub(self.learning_rate * (v_corrected / (tf.sqrt(s_corrected) + self.epsilon)))
        self.t.assign_add(1.0)


def training_step(tf, model: MLP, optimizer: Adam):
    """The job's ``tf.function`` train step, as the example writes it: loss and accuracy of a packed batch, then Adam."""

    @tf.function
    def train_step(x_batch, y_batch):
        with tf.GradientTape() as tape:
            logits = model(x_batch)
            batch_loss = cross_entropy_loss(tf, logits, y_batch)
        gradients = tape.gradient(batch_loss, model.trainable_variables)
        optimizer.apply_gradients(gradients)
        return batch_loss, accuracy(tf, logits, y_batch)

    return train_step


def cross_entropy_loss(tf, logits, labels):
    sparse_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(sparse_ce)


def accuracy(tf, logits, labels):
    predictions = tf.argmax(logits, axis=1)
    return tf.reduce_mean(tf.cast(tf.equal(labels, predictions), tf.float32))


def repack_local_tensor(dtensor, tf, x, layout):
    """A local tensor → a DTensor with ``layout``, split along its sharded axes (single client)."""
    x = tf.convert_to_tensor(x)
    sharded_dims = []
    queue = [x]
    for axis, dim in enumerate(layout.sharding_specs):
        if dim == dtensor.UNSHARDED:
            continue
        num_splits = layout.shape[axis]
        queue = tf.nest.map_structure(
            lambda tensor, num_splits=num_splits, axis=axis: tf.split(tensor, num_splits, axis=axis), queue
        )
        sharded_dims.append(dim)
    components = []
    for locations in layout.mesh.local_device_locations():
        tensor = queue[0]
        for dim in sharded_dims:
            tensor = tensor[locations[dim]]
        components.append(tensor)
    return dtensor.pack(components, layout)


def first_component(dtensor, variable):
    """What the mesh's first device holds of a DVariable (every device of a replicated one holds the same)."""
    return dtensor.unpack(variable.read_value())[0]


def unpack_first(dtensor, value):
    """A replicated DTensor scalar as a plain value (every device holds the same)."""
    return dtensor.unpack(value)[0]


SPECS = (
    JobSpec(
        name="dtensor-mlp",
        title="DTensor data-parallel MLP",
        description=(
            "The DTensor MNIST example: an MLP 784→700→500→10 trained data-parallel over a DTensor mesh "
            "[('batch', N)] of the logical devices, replicated weights, batch-sharded inputs, hand-written Adam."
        ),
        params=PARAMS,
        run=run_dtensor_mlp,
        run_jax="jobs.on_jax.dtensor_mlp:run_dtensor_mlp_jax",
        check_runtime=check_runtime,
    ),
)
