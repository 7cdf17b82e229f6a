"""The Jobs screen: forms generated from params, checked as the user types; enter on the list opens a form, in it launches."""

from __future__ import annotations

from textual import events
from textual.widgets import Button, OptionList, Select

from screens.jobs import JobsScreen
from tests.functional.conftest import SIZE, run_settled, runtime_ready, shown_live, type_into, until
from tpudash.tui.paramform import ParamForm


async def test_jobs_screen_lists_every_job_with_a_form_of_its_params(make_app, test_specs):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("j")
        assert isinstance(app.screen, JobsScreen)
        job_list = app.screen.query_one("#job-list", OptionList)
        assert [job_list.get_option_at_index(i).id for i in range(job_list.option_count)] == list(test_specs)
        await pilot.press("down", "down", "down", "down")  # gradient-descent
        form = app.screen.current_form
        assert form.spec.name == "gradient-descent"
        assert form.field("learning_rate").input.value == "0.1"
        assert isinstance(form.field("optimizer").input, Select)
        assert form.field("optimizer").input.value == "sgd"
        assert form.params is not None and form.params["steps"] == 20


async def test_an_invalid_field_is_explained_as_typed_and_blocks_launch(make_app, isolated_runs_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j")
        app.screen.select_job("gradient-descent")
        await pilot.pause()
        form: ParamForm = app.screen.current_form
        field = form.field("learning_rate")
        await type_into(pilot, field.input, "-0.5")
        assert field.has_class("-invalid")
        assert "out of range" in field.error and "> 0" in field.error
        await pilot.press("enter")
        assert not app.session.live_runs and not app.session.busy
        assert not isolated_runs_dir.exists() or not any(isolated_runs_dir.iterdir())
        assert any("learning_rate" in message and severity == "error" for _, severity, message in app.notices)
        assert app.focused is field.input

        await type_into(pilot, field.input, "abc")
        assert "'abc' is not a number" in field.error
        # A device index the runtime does not have is caught before launch too.
        await type_into(pilot, field.input, "0.1")
        assert not field.has_class("-invalid")
        device = form.field("device")
        await type_into(pilot, device.input, "8")
        assert device.has_class("-invalid")
        await pilot.press("enter")
        assert not app.session.live_runs

        await type_into(pilot, device.input, "3")
        await pilot.press("enter")
        live = shown_live(app)
        await run_settled(pilot, live)
        assert live.model.status == "done"
        assert live.model.params["device"] == 3


async def test_enter_launches_a_small_matmul_typed_into_the_form(make_app, runtime):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j")
        form: ParamForm = app.screen.current_form
        assert form.spec.name == "matmul"
        for name in ("m", "k", "n"):
            await type_into(pilot, form.field(name).input, "64")
        await type_into(pilot, form.field("devices").input, "0,2-3")
        await pilot.press("enter")
        live = shown_live(app)
        await run_settled(pilot, live)
        assert live.model.status == "done"
        assert live.model.params["m"] == 64
        assert sorted(live.model.device_results()) == [runtime.device_names[i] for i in (0, 2, 3)]


def _single_set_cases():
    """The CLI's bad ``--set NAME=VALUE`` inputs for one param: (id, job, name, value, field marked, messages)."""
    from jobs import registry
    from tests.unit.test_reliability_cli import BAD_INPUTS

    specs = registry()
    cases = []
    for case in BAD_INPUTS:
        argv, _environment, fragments = case.values
        if len(argv) != 4 or argv[0] != "run" or argv[2] != "--set" or "=" not in argv[3] or argv[1] not in specs:
            continue
        job, (name, value) = argv[1], argv[3].split("=", 1)
        if value.strip() and any(param.name == name for param in specs[job].params):
            # The CLI says "field: message" (the field may be another one, for
            # a rule across fields); that field shows the message.
            marked = fragments[0].split(": ", 1)[0]
            cases.append((case.id, job, name, value, marked, [fragment.split(": ", 1)[-1] for fragment in fragments]))
    return cases


async def paste_into(pilot, widget, text: str) -> None:
    """Focus an Input, clear it, and paste ``text`` into it: one bracketed paste, as a terminal sends it.

    The value reaches the Input through the app, as typing does, and the Input
    applies the same checks to it; typed key by key (pilot.press waits for the
    app to idle after every key) forty values took most of this module's time.
    Typing itself, and letters in a form never acting as the app's keys, have
    tests of their own above and below.
    """
    widget.focus()
    widget.value = ""
    pilot.app.post_message(events.Paste(text))
    await pilot.pause()
    assert widget.value == text, (widget.value, text)


async def test_every_bad_value_the_cli_refuses_is_marked_in_the_form_and_launches_nothing(make_app, isolated_runs_dir):
    from textual.widgets import Input

    app = make_app()
    entered = []
    # One app, each job's form selected once: the cases grouped by job (the order of jobs as the CLI table has them).
    cases = _single_set_cases()
    job_order = list(dict.fromkeys(case[1] for case in cases))
    cases.sort(key=lambda case: job_order.index(case[1]))
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j")
        selected = None
        for case_id, job, name, value, marked, fragments in cases:
            if job != selected:
                app.screen.select_job(job)
                await pilot.pause()
                selected = job
            form: ParamForm = app.screen.current_form
            assert form.spec.name == job, case_id
            form.reset()
            field = form.field(name)
            if not isinstance(field.input, Input):
                continue  # a choice or a switch: the form cannot hold a bad value
            await paste_into(pilot, field.input, value)
            marked_field = form.field(marked)
            assert marked_field.has_class("-invalid"), case_id
            for fragment in fragments:
                assert fragment in (marked_field.error or ""), (case_id, marked_field.error)
            await pilot.press("enter")
            assert not app.session.live_runs, case_id
            entered.append(case_id)
        assert not isolated_runs_dir.exists() or not any(isolated_runs_dir.iterdir())
    assert len(entered) >= 30, entered


async def test_letters_typed_anywhere_in_a_form_never_act_as_the_apps_keys(make_app, job_gate):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "1000"})
        await until(pilot, lambda: job_gate.reached.is_set())
        await pilot.press("j")
        assert isinstance(app.screen, JobsScreen)
        # One tab from the job list, then "abc": c must not cancel the run.
        await pilot.press("tab", *"abc")
        form = app.screen.current_form
        assert app.focused is not None and form in app.focused.ancestors_with_self
        assert live.cancel_requested_at is None and not app.session.live_runs[live.run_id].settled.is_set()
        # Every kind of widget in a form: a field, a select, a switch, a button.
        app.screen.select_job("train")
        await pilot.pause()
        form = app.screen.current_form
        targets = [
            form.field("epochs").input,
            form.field("optimizer").input,
            form.field("deterministic").input,
            form.query_one(".launch", Button),
        ]
        for target in targets:
            target.focus()
            await pilot.press(*"cqdmrgth?")
            assert isinstance(app.screen, JobsScreen), type(target)  # no screen switch, no quit dialog
            assert app.focused is target
        assert live.cancel_requested_at is None and live.model.status == "running"
        assert list(app.session.live_runs) == [live.run_id], "a letter launched a job"
        job_gate.release.set()
        await run_settled(pilot, live)


async def test_enter_on_the_job_list_opens_the_form_and_launches_nothing(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j", "down")
        job_list = app.screen.query_one("#job-list", OptionList)
        assert app.focused is job_list
        await pilot.press("enter")
        form = app.screen.current_form
        await until(pilot, lambda: app.focused is form.fields[0].input)
        assert form.spec.name == "replica-matmul"
        assert not app.session.live_runs and not app.session.busy
        # Launching happens from the form: enter in a field or on Launch (on a select, enter opens its choices).
        await pilot.press("tab")  # replica-matmul's guide inputs have one field: tab reaches Launch
        assert app.focused is form.query_one(".launch", Button)
        await pilot.press("enter")
        live = shown_live(app)
        assert live is not None and live.model.job == "replica-matmul"
        await run_settled(pilot, live)


async def test_a_param_that_has_no_effect_is_hidden_until_it_applies(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("j")
        app.screen.select_job("gradient-descent")
        await pilot.pause()
        form: ParamForm = app.screen.current_form
        momentum = form.field("momentum")
        assert form.field("optimizer").input.value == "sgd"
        assert not momentum.display and not momentum.region.area
        form.set_value("optimizer", "momentum")
        await pilot.pause()
        assert momentum.display and momentum.region.area
        form.set_value("optimizer", "adam")
        await pilot.pause()
        assert not momentum.region.area
        # The same declaration drives every job: replica-matmul's shape and seed are for random inputs only.
        app.screen.select_job("replica-matmul")
        await pilot.pause()
        form = app.screen.current_form
        shape = [form.field(name) for name in ("m", "k", "n", "seed")]
        assert form.field("source").input.value == "guide"
        assert not any(field.region.area for field in shape)
        form.set_value("source", "random")
        await pilot.pause()
        assert all(field.region.area for field in shape)
