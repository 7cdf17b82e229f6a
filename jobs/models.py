"""The models the training job can build, by name, and their summary table.

- ``mnist-cnn``: the MNIST CNN of TensorFlow's "Use TPUs" guide (Conv
  256-3, Conv 256-3, Flatten, Dense 256, Dense 128, Dense 10 logits).
- ``cifar-cnn``: the CIFAR-10 CNN of the Colab TPU walkthrough (Conv
  32/64/128 with max pooling, Dense 64, Dense 10 softmax): 225,034
  parameters on 32×32×3 images.
- ``light``: a small CNN per input shape that trains in seconds on a CPU.

Every model takes the dataset's image shape, so any model runs on any
dataset (the published figures hold on each model's own dataset). The last layer is
always float32 so that under a mixed precision policy the loss sees float32
values (TensorFlow's mixed precision guide). Models must be built under ``strategy.scope()`` by the
caller. Nothing here imports tensorflow or keras at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.events import Table


@dataclass(frozen=True)
class ModelRecipe:
    """How to build one named model."""

    name: str
    description: str
    from_logits: bool
    build: Callable[[tuple, int], Any]


def _mnist_cnn(input_shape: tuple, num_classes: int):
    import keras

    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(256, 3, activation="relu"),
            layers.Conv2D(256, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(256, activation="relu"),
            layers.Dense(128, activation="relu"),
            layers.Dense(num_classes, dtype="float32", name="logits"),
        ],
        name="mnist_cnn",
    )


def _cifar_cnn(input_shape: tuple, num_classes: int):
    import keras

    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, (3, 3), activation="relu"),
            layers.MaxPooling2D((2, 2)),
            layers.Conv2D(64, (3, 3), activation="relu"),
            layers.MaxPooling2D((2, 2)),
            layers.Conv2D(128, (3, 3), activation="relu"),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, activation="softmax", dtype="float32", name="probabilities"),
        ],
        name="cifar_cnn",
    )


def _light(input_shape: tuple, num_classes: int):
    import keras

    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, dtype="float32", name="logits"),
        ],
        name="light",
    )


MODELS: dict[str, ModelRecipe] = {
    "light": ModelRecipe(
        "light", "small CNN (Conv 16, Conv 32, Dense 64) that trains in seconds on a CPU", True, _light
    ),
    "mnist-cnn": ModelRecipe(
        "mnist-cnn", 'the "Use TPUs" guide\'s MNIST CNN (Conv 256-3 ×2, Dense 256, 128, 10)', True, _mnist_cnn
    ),
    "cifar-cnn": ModelRecipe(
        "cifar-cnn",
        "the Colab TPU walkthrough's CIFAR-10 CNN (Conv 32/64/128, Dense 64, 10): 225,034 params",
        False,
        _cifar_cnn,
    ),
}
MODEL_NAMES = tuple(MODELS)


def build_model(name: str, input_shape: tuple, num_classes: int):
    """The named model for images of ``input_shape``; call under ``strategy.scope()``."""
    if name not in MODELS:
        raise ValueError(f"model: {name!r} is not one of {', '.join(MODEL_NAMES)}")
    return MODELS[name].build(tuple(input_shape), num_classes)


def parameter_count(model: Any) -> int:
    return int(sum(int(_size(weight.shape)) for weight in model.weights))


def _size(shape) -> int:
    total = 1
    for dimension in shape:
        total *= int(dimension)
    return total


def _shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        return ", ".join(_shape_text(item) for item in shape)
    return "(" + ", ".join("None" if dimension is None else str(dimension) for dimension in shape) + ")"


def summary_table(model: Any, title: str | None = None) -> Table:
    """Layers, output shapes, dtypes and parameter counts, like ``model.summary()``."""
    rows = []
    for layer in model.layers:
        try:
            output_shape = _shape_text(layer.output.shape)
        except (AttributeError, ValueError):
            output_shape = "?"
        policy = getattr(layer, "dtype_policy", None)
        rows.append(
            [
                f"{layer.name} ({type(layer).__name__})",
                output_shape,
                getattr(policy, "name", str(getattr(layer, "dtype", ""))),
                int(layer.count_params()),
            ]
        )
    total = parameter_count(model)
    trainable = int(sum(_size(weight.shape) for weight in model.trainable_weights))
    rows.append(["total", "", "", total])
    if trainable != total:
        rows.append(["trainable", "", "", trainable])
    return Table(
        title=title or f"model {model.name}: {total:,} params",
        columns=["layer (type)", "output shape", "dtype policy", "params"],
        rows=rows,
    )
