"""The dashboard's session and the framework: JAX without TensorFlow starts the engine, a job with no runner on
the session's framework is refused saying why, and the palette's switch starts the engine on the other framework.

Textual-free, as ``tests/unit/test_session.py`` (whose plain view and scripted engines these use).
"""

from __future__ import annotations

import pytest

from jobs.base import JobSpec, Param
from tests.unit.test_framework_choice import jax_description
from tests.unit.test_session import STEPS, Clock, FakeView, ScriptedEngine, engine_says, host_check
from tpudash.config import Settings
from tpudash.engine.protocol import PROTOCOL_VERSION, Hello, RuntimeReady
from tpudash.tui.session import DashboardSession

JAX_INSTALL_LINE = 'pip install "jax[cpu]>=0.10.2,<0.11" "keras>=3.15,<4"'
ON_BOTH = JobSpec(
    "on-both",
    "On both",
    "counts",
    (Param("steps", "int", 3, minimum=1),),
    lambda ctx, params: {},
    run_jax=lambda *a: {},
)
TF_ONLY = JobSpec(
    "tf-only", "TF only", "tf.data", (), lambda ctx, params: {}, not_on_jax="it demonstrates tf.data's API"
)


@pytest.fixture
def view():
    return FakeView()


@pytest.fixture
def engines():
    return []


@pytest.fixture
def make_session(settings, view, engines):
    def make(**overrides) -> DashboardSession:
        def start(listener):
            engine = ScriptedEngine(listener)
            engine.settings = session.engine_settings  # what a real engine process would be started with
            engines.append(engine)
            return engine

        session = DashboardSession(
            Settings(**{**settings.__dict__, **overrides}),
            view,
            engine_factory=start,
            clock=Clock(),
            job_specs={"steps": STEPS, "on-both": ON_BOTH, "tf-only": TF_ONLY},
        )
        return session

    return make


def test_with_jax_and_no_tensorflow_the_engine_starts_on_jax(make_session, view, engines):
    session = make_session()
    session.engine_needed()
    session.host_checked(host_check(tensorflow=False, jax=True))
    assert len(engines) == 1 and view.framework_missing is None
    assert session.framework == "jax" and engines[0].settings.framework == "auto"  # the engine resolves it alike
    engine_says(session, view, engines[0], Hello(pid=4242, protocol=PROTOCOL_VERSION, framework="jax"))
    assert view.engine_status == "starting on JAX…"
    engine_says(session, view, engines[0], RuntimeReady(jax_description().to_dict()))
    assert view.runtime_status == "JAX · CPU · Mesh · 8 replicas"
    assert view.engine_status == "ready on CPU (JAX)"


def test_asked_for_jax_where_it_is_missing_says_what_to_install_and_starts_nothing(make_session, view, engines):
    session = make_session(framework="jax")
    session.engine_needed()
    session.host_checked(host_check(tensorflow=True, jax=False))
    assert engines == [] and view.runtime_status == "no JAX"
    assert view.framework_missing == f"JAX is not installed; jobs on JAX need it: {JAX_INSTALL_LINE}"
    assert session.launch_by_name("on-both") is None
    assert view.titles()[-1] == "on-both not launched: no JAX"


def test_on_jax_a_job_without_a_jax_runner_is_refused_saying_why_and_nothing_reaches_the_engine(
    make_session, view, engines, store
):
    session = make_session()
    session.host_checked(host_check(tensorflow=False, jax=True))
    assert session.launch_by_name("tf-only") is None
    assert view.notices[-1] == ("error", "tf-only not launched", "not on JAX: it demonstrates tf.data's API")
    assert engines == [] and store.list_runs() == []

    live = session.launch_by_name("on-both", {"steps": "2"})  # a job with a JAX runner goes to the engine
    assert live is not None and len(engines) == 1
    assert session.not_on_framework(ON_BOTH) is None


def test_on_tensorflow_the_same_job_launches(make_session, view, engines):
    session = make_session()
    session.host_checked(host_check(tensorflow=True, jax=True))
    assert session.framework == "tensorflow"
    assert session.launch_by_name("tf-only") is not None and len(engines) == 1


def test_the_palettes_switch_starts_a_new_engine_on_the_framework_chosen(make_session, view, engines):
    session = make_session()
    session.engine_needed()
    session.host_checked(host_check(tensorflow=True, jax=True))
    assert len(engines) == 1 and engines[0].settings.framework == "auto"

    assert session.use_framework("jax") is None
    assert len(engines) == 2 and engines[0].release_requested
    assert engines[1].settings.framework == "jax" and session.settings.framework == "jax"
    assert view.runtime_status == "connecting…"


def test_switching_to_a_framework_that_is_missing_releases_the_engine_and_says_what_to_install(
    make_session, view, engines
):
    session = make_session()
    session.engine_needed()
    session.host_checked(host_check(tensorflow=True, jax=False))
    assert session.use_framework("jax") is None
    assert len(engines) == 1 and engines[0].release_requested
    assert view.runtime_status == "no JAX" and JAX_INSTALL_LINE in view.framework_missing


def test_a_busy_engine_is_not_switched(make_session, view, engines):
    session = make_session()
    session.host_checked(host_check(tensorflow=True, jax=True))
    session.launch_by_name("steps")
    assert session.busy
    assert session.use_framework("jax") == "a run holds the engine: cancel it or wait, then switch"
    assert session.settings.framework == "auto" and len(engines) == 1


def test_the_palette_offers_each_framework_the_session_is_not_set_to_and_switches_through_the_app(make_session):
    from tpudash.tui.palette import framework_commands

    switched = []
    app = type("PaletteStandIn", (), {})()
    app.session = make_session(framework="jax")
    app.action_use_framework = switched.append
    commands = framework_commands(app)
    assert [name for name, _, _ in commands] == [
        "Framework: run jobs on the automatic choice (re-initialise)",
        "Framework: run jobs on TensorFlow (re-initialise)",
    ]
    assert all(help_text.startswith("now jax; ") for _, _, help_text in commands)
    commands[1][1]()
    assert switched == ["tensorflow"]
