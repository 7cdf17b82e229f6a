"""jobs.models: the published architectures, the light model, mixed precision, the summary table."""

from __future__ import annotations

import pytest

from jobs.models import MODEL_NAMES, MODELS, build_model, parameter_count, summary_table


@pytest.fixture(autouse=True)
def shared_runtime(runtime):
    """TensorFlow's devices are configured once per process: set up the shared
    8-device runtime before these tests touch TensorFlow, or every later test
    in the session would see one device."""
    return runtime


@pytest.fixture
def float32_policy():
    import keras

    previous = keras.mixed_precision.global_policy()
    yield keras
    keras.mixed_precision.set_global_policy(previous)


def test_cifar_cnn_has_the_225034_parameters_of_the_colab_walkthrough():
    model = build_model("cifar-cnn", (32, 32, 3), 10)
    assert parameter_count(model) == 225_034
    assert model.count_params() == 225_034


def test_cifar_cnn_layers_are_the_colab_walkthroughs():
    model = build_model("cifar-cnn", (32, 32, 3), 10)
    described = [(type(layer).__name__, layer.output.shape[1:]) for layer in model.layers]
    assert described == [
        ("Conv2D", (30, 30, 32)),
        ("MaxPooling2D", (15, 15, 32)),
        ("Conv2D", (13, 13, 64)),
        ("MaxPooling2D", (6, 6, 64)),
        ("Conv2D", (4, 4, 128)),
        ("Flatten", (2048,)),
        ("Dense", (64,)),
        ("Dense", (10,)),
    ]
    assert not MODELS["cifar-cnn"].from_logits  # softmax output, like the walkthrough's


def test_mnist_cnn_layers_are_the_use_tpus_guides():
    model = build_model("mnist-cnn", (28, 28, 1), 10)
    convolutions = [(layer.filters, layer.kernel_size) for layer in model.layers if type(layer).__name__ == "Conv2D"]
    dense_units = [layer.units for layer in model.layers if type(layer).__name__ == "Dense"]
    assert convolutions == [(256, (3, 3)), (256, (3, 3))]
    assert dense_units == [256, 128, 10]
    assert MODELS["mnist-cnn"].from_logits  # the guide trains with from_logits=True


@pytest.mark.parametrize("input_shape", [(28, 28, 1), (32, 32, 3)])
def test_light_model_is_small_and_fits_every_dataset_shape(input_shape):
    model = build_model("light", input_shape, 10)
    assert model.outputs[0].shape[1:] == (10,)
    assert parameter_count(model) < 150_000


def test_output_layer_stays_float32_under_mixed_precision(float32_policy):
    keras = float32_policy
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    for name in MODEL_NAMES:
        model = build_model(name, (32, 32, 3), 10)
        hidden, output = model.layers[0], model.layers[-1]
        assert hidden.compute_dtype == "bfloat16", name
        assert output.compute_dtype == "float32", name
        assert model.outputs[0].dtype == "float32", name


def test_summary_table_lists_every_layer_and_the_total():
    model = build_model("cifar-cnn", (32, 32, 3), 10)
    table = summary_table(model)
    assert table.columns == ["layer (type)", "output shape", "dtype policy", "params"]
    layer_rows, total_row = table.rows[:-1], table.rows[-1]
    assert len(layer_rows) == len(model.layers)
    assert layer_rows[0][0].endswith("(Conv2D)") and layer_rows[0][1] == "(None, 30, 30, 32)"
    assert sum(row[3] for row in layer_rows) == total_row[3] == 225_034
    assert "225,034" in table.title


def test_unknown_model_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match="light"):
        build_model("resnet", (28, 28, 1), 10)
