"""The framework the engine runs jobs on: ``--framework`` > ``TPUDASH_FRAMEWORK`` > auto, and what auto picks.

No TensorFlow and no JAX is imported: auto only looks (``find_spec``), and
the engine's choice is checked with the JAX detection replaced.
"""

from __future__ import annotations

import pytest

from jobs.base import JobSpec, Param
from tpudash.accel import hostcheck, jaxdetect
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.accel.startup import RuntimeSetupError
from tpudash.cli import main as cli
from tpudash.config import Settings, SettingsError, resolve_framework, settings_environment
from tpudash.engine import __main__ as engine_main
from tpudash.engine.protocol import Hello
from tpudash.engine.server import EngineServer


def finds(*installed: str):
    """A ``find_spec`` that finds only ``installed``."""
    return lambda name: object() if name in installed else None


@pytest.mark.parametrize(
    ("flags", "environ", "expected"),
    [
        ({}, {}, "auto"),
        ({}, {"TPUDASH_FRAMEWORK": "jax"}, "jax"),
        ({"framework": "tensorflow"}, {"TPUDASH_FRAMEWORK": "jax"}, "tensorflow"),
        ({"framework": " JAX "}, {}, "jax"),
        ({"framework": None}, {"TPUDASH_FRAMEWORK": "Auto"}, "auto"),
    ],
)
def test_the_flag_beats_the_variable_beats_auto(flags, environ, expected):
    assert Settings.load(flags, environ=environ).framework == expected


@pytest.mark.parametrize(
    ("flags", "environ", "message"),
    [
        ({"framework": "mxnet"}, {}, "--framework: 'mxnet' is not a framework; allowed: auto, tensorflow, jax"),
        (
            {},
            {"TPUDASH_FRAMEWORK": "torch"},
            "TPUDASH_FRAMEWORK: 'torch' is not a framework; allowed: auto, tensorflow",
        ),
    ],
)
def test_a_framework_that_is_not_one_is_named_with_what_is_allowed(flags, environ, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        Settings.load(flags, environ=environ)


def test_the_command_line_refuses_a_bad_framework_with_exit_2(capsys):
    assert cli.main(["devices", "--framework", "pytorch"]) == 2
    assert capsys.readouterr().err == (
        "tpudash: error: --framework: 'pytorch' is not a framework; allowed: auto, tensorflow, jax\n"
    )


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        (("tensorflow", "jax"), "tensorflow"),  # both: TensorFlow, as before JAX could run jobs
        (("jax",), "jax"),  # Colab's TPU runtime
        ((), "tensorflow"),  # neither: TensorFlow's "not installed" path names the fix
    ],
)
def test_auto_picks_tensorflow_where_installed_else_jax(installed, expected):
    assert resolve_framework("auto", finds(*installed)) == expected


def test_an_explicit_framework_is_kept_whatever_is_installed():
    assert resolve_framework("jax", finds("tensorflow")) == "jax"
    assert resolve_framework("tensorflow", finds("jax")) == "tensorflow"


def test_the_dashboard_hands_its_framework_to_the_engine_it_starts():
    environment = settings_environment(Settings(framework="jax"), {})
    assert Settings.load({}, environ=environment).framework == "jax"


def test_the_engines_own_flags_beat_its_variables():
    assert engine_main.engine_flags(["--framework", "jax", "--tpu", "none"]) == {
        "framework": "jax",
        "tpu": "none",
        "cpu_devices": None,
    }


def test_the_engine_detects_on_jax_when_the_framework_resolves_to_it(monkeypatch):
    asked = []
    monkeypatch.setattr(jaxdetect, "detect_jax_runtime", lambda settings: asked.append(settings) or "mesh")
    settings = Settings(framework="jax", tpu="none")
    assert engine_main.detect_runtime(settings) == "mesh"
    assert asked == [settings]


def test_the_engines_hello_says_which_framework_it_runs(settings):
    said = []
    server = EngineServer(lambda reply, _id: said.append(reply), settings, {}, lambda: None, framework="jax")
    server._detection = type("NoDetection", (), {"start": lambda self: None})()  # the hello alone is under test
    assert server.start()
    assert said == [Hello(pid=said[0].pid, protocol=said[0].protocol, framework="jax")]


# -- whether JAX may take the TPU ----------------------------------------------------------------------

V5E = hostcheck.Chips("TPU v5 lite chip", 4, 16, 1)
NOTEBOOK = hostcheck.TpuHolder(77, "python notebook.py", ("/dev/accel0",), "JAX")


def host(chips: hostcheck.Chips = V5E, holders=()) -> hostcheck.HostCheck:
    return hostcheck.HostCheck(chips, {}, list(holders), False, hostcheck.diagnose(chips, {}, list(holders), False))


def test_jax_takes_this_hosts_chips_unless_told_or_held():
    assert jaxdetect.tpu_for_jax(None, host(), {}) == (True, {})
    assert jaxdetect.tpu_for_jax("local", host(), {}) == (True, {})
    assert jaxdetect.tpu_for_jax("none", host(), {}) == (False, {"TPU": "--tpu none given: the TPU is left alone"})
    use_tpu, reasons = jaxdetect.tpu_for_jax(None, host(hostcheck.Chips()), {})
    assert not use_tpu and reasons["TPU"].startswith("the chip scan finds none")
    use_tpu, reasons = jaxdetect.tpu_for_jax(None, host(holders=[NOTEBOOK]), {})
    assert not use_tpu and "held by the JAX process pid 77 (python notebook.py)" in reasons["TPU"]


def test_jax_refuses_a_tpu_it_cannot_drive_as_asked():
    with pytest.raises(RuntimeSetupError, match="--tpu local given, but the TPU is held by the JAX process pid 77"):
        jaxdetect.tpu_for_jax("local", host(holders=[NOTEBOOK]), {})
    with pytest.raises(RuntimeSetupError, match="a TPU by name or address needs the TensorFlow engine"):
        jaxdetect.tpu_for_jax("grpc://10.0.0.2:8470", host(), {})


# -- what a JAX runtime looks like to the CLI and the screens ------------------------------------------


def jax_description(devices: int = 8, platform: str = "cpu", kind: str = "cpu") -> RuntimeDescription:
    rows = [
        LogicalDeviceInfo(
            index, f"{platform.upper()}:{index}", platform.upper(), platform=platform, device_kind=kind, process_index=0
        )
        for index in range(devices)
    ]
    return RuntimeDescription(
        kind=platform.upper(),
        strategy="Mesh",
        num_replicas=devices,
        devices=rows,
        framework="jax",
        jax_version="0.10.2",
    )


def test_the_header_names_jax_its_version_and_its_devices():
    assert jax_description().framework_text() == "JAX 0.10.2 · 8 CPU devices"
    assert jax_description(4, "tpu", "TPU v5 lite").framework_text() == "JAX 0.10.2 · 4 TPU v5 lite chips"
    assert jax_description(8, "tpu", "TPU v3").devices_text() == "8 TPU v3 cores"
    assert RuntimeDescription("CPU", "MirroredStrategy", 8, [], tf_version="2.21.0").framework_text() == (
        "TensorFlow 2.21.0"
    )


TF_ONLY = JobSpec(
    "tf-only",
    "TF only",
    "TensorFlow's own API",
    (Param("steps", "int", 2, minimum=1),),
    lambda ctx, params: {},
    not_on_jax="it demonstrates tf.data's API",
)


def test_a_job_lists_its_frameworks_and_why_not_jax_in_its_help():
    from tpudash.cli.render import frameworks_text

    assert str(frameworks_text(TF_ONLY)) == "runs on: TensorFlow (not on JAX: it demonstrates tf.data's API)"
    both = JobSpec("both", "Both", "either", (), lambda ctx, params: {}, run_jax=lambda ctx, params: {})
    assert str(frameworks_text(both)) == "runs on: TensorFlow, JAX"


def test_tpudash_run_refuses_a_job_with_no_runner_on_the_framework_before_starting_anything():
    from tpudash.cli.commands import checked_framework
    from tpudash.cli.exits import BadInput

    with pytest.raises(BadInput, match="job 'tf-only' does not run on jax: it demonstrates tf.data's API"):
        checked_framework(TF_ONLY, Settings(framework="jax"))
    checked_framework(TF_ONLY, Settings(framework="tensorflow"))  # runs there


def test_a_jax_runtime_crosses_to_the_dashboard_and_says_its_framework():
    runtime = Runtime.from_description(jax_description().to_dict())
    assert runtime.framework == "jax" and runtime.description.devices[3].platform == "cpu"


def test_asked_for_jax_where_it_is_missing_the_engine_says_what_to_install(monkeypatch):
    monkeypatch.setattr(jaxdetect.importlib.util, "find_spec", finds("tensorflow"))
    with pytest.raises(
        jaxdetect.JaxMissing, match=r'^JAX is not installed; jobs on JAX need it: pip install "jax\[tpu\]"'
    ):
        jaxdetect.detect_jax_runtime(Settings(framework="jax"), host=host())


def test_headless_tpudash_run_on_jax_says_in_one_line_why_jax_cannot_start(monkeypatch):
    from tpudash.engine import headless

    def cannot_start(settings):
        raise RuntimeError("Unable to initialize backend 'tpu'")

    monkeypatch.setattr(jaxdetect, "detect_jax_runtime", cannot_start)
    monkeypatch.setattr(headless, "_jax_runtime", None)
    monkeypatch.setenv("TPUDASH_NATIVE_STDERR", "terminal")
    with pytest.raises(headless.RuntimeUnavailable, match=r"^JAX could not start: RuntimeError: Unable to initialize"):
        headless.detect_runtime(Settings(framework="jax"), restartable=False)
