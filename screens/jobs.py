"""The Jobs screen: every registered job, and a form generated from its params.

Moving through the list shows the highlighted job's form (defaults filled,
help text, choices as selects, switches for booleans); ``enter`` on the list
(or a click, or ``t`` for train) puts the cursor in the form, and there
typing is only typing: no letter reaches the app's keys. The form is only
ever entered on purpose: leaving the screen puts the cursor back on the
list, so ``j`` lands there. Fields are checked as the user types and marked
with what is wrong and what is allowed; ``enter`` in a field or on the
Launch button launches only when every field, the rules across fields and
(once the runtime is known) the runtime checks pass; on a select or a switch
enter does what it does everywhere in Textual (opens the list, toggles).
Forms keep what was typed while the app runs. The bottom line shows the
accelerator lane and its queue. A job without a JAX runner says so in the
list (``TensorFlow only``) and in its form (``not on JAX: why``); while the
session runs on JAX its form refuses to launch with that reason.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import AwaitMount
from textual.widgets import Button, ContentSwitcher, Input, OptionList, Select, Static, Switch
from textual.widgets.option_list import Option

from screens.base import DashScreen
from tpudash.tui.paramform import ParamForm


def form_id(job_name: str) -> str:
    return "form-" + "".join(char if char.isalnum() else "-" for char in job_name)


class JobsScreen(DashScreen):
    """Pick a job, fill its form, press enter."""

    CSS_PATH = "jobs.tcss"

    BINDINGS = [
        # Priority, so each acts before the keys typed after it are handed
        # out (a paste of "enter512" types 512 into the form it opened).
        # check_action enables one at a time, so the keys line says what
        # enter does where the cursor is: on the job list it opens the form;
        # in a field or on the Launch button it launches; on a select it
        # opens its list and on a switch it toggles, as everywhere in Textual.
        Binding("enter", "launch", "Launch", id="jobs.launch", priority=True),
        Binding("enter", "open_highlighted", "Open form", id="jobs.open", priority=True),
        Binding("enter", "open_choices", "Choose", id="jobs.choose", priority=True),
        Binding("enter", "toggle_switch", "Toggle", id="jobs.toggle", priority=True),
        Binding("escape", "focus_list", "Job list", id="jobs.list", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._forms_being_built: dict[ParamForm, AwaitMount] = {}
        """Forms mounted but maybe not built yet, by id: enter waits for its form."""

    def compose_body(self) -> ComposeResult:
        specs = self.dashboard.session.job_specs
        with Horizontal(id="jobs-body"):
            options = []
            for name, spec in specs.items():
                key = f"  [{spec.key}]" if spec.key else ""
                # A job without a JAX runner says so in the list too (its form says why).
                only = "" if "jax" in spec.frameworks() else "  TensorFlow only"
                options.append(
                    Option(
                        Text.assemble((spec.title, "bold"), "\n", (f"{name}{key}", "dim"), (only, "yellow")), id=name
                    )
                )
            yield OptionList(*options, id="job-list")
            yield ContentSwitcher(id="forms")
        yield Static("", id="lane-line")

    def on_mount(self) -> None:
        self.watch(self.app, "runtime", self._runtime_changed, init=False)
        self.watch(self.app, "lane_version", self._show_lane)
        job_list = self.query_one("#job-list", OptionList)
        if job_list.option_count:
            job_list.highlighted = 0
        # At once, not at the next turn (focus()): t or the palette may put the cursor in a form right after.
        self.set_focus(job_list)
        # Synchronous, in the switch itself: a key typed right after j must find the cursor on the list.
        self.app.mode_change_signal.subscribe(self, self._mode_changed)

    def _mode_changed(self, mode: str) -> None:
        # Leaving the screen (a launch shows its run, d, h, the palette): the
        # next visit starts on the job list, so arrows and enter cannot launch
        # the form last typed into by accident.
        if mode != "jobs":
            self.set_focus(self.query_one("#job-list", OptionList), scroll_visible=False)

    # -- the forms ----------------------------------------------------------------
    def form_for(self, name: str) -> ParamForm:
        """The form of job ``name``, created the first time it is shown."""
        switcher = self.query_one("#forms", ContentSwitcher)
        existing = switcher.query(f"#{form_id(name)}")
        if existing:
            return existing.first(ParamForm)
        session = self.dashboard.session
        form = ParamForm(
            session.job_specs[name],
            runtime=lambda: self.dashboard.runtime,
            not_here=session.not_on_framework,
            id=form_id(name),
        )
        self._forms_being_built[form] = switcher.mount(form)
        return form

    @property
    def current_form(self) -> ParamForm | None:
        switcher = self.query_one("#forms", ContentSwitcher)
        if not switcher.current:
            return None
        return switcher.query_one(f"#{switcher.current}", ParamForm)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "job-list" and event.option_id:
            event.stop()
            self.form_for(event.option_id)
            self.query_one("#forms", ContentSwitcher).current = form_id(event.option_id)

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        # Enter or a click on a job: show its form and put the cursor in it.
        if event.option_list.id == "job-list" and event.option_id:
            event.stop()
            await self.open_form(event.option_id)

    def select_job(self, name: str) -> ParamForm | None:
        """Show job ``name``'s form, the cursor staying on the job list."""
        form = self._show_form(name)
        if form is not None:
            self.query_one("#job-list", OptionList).focus()
        return form

    async def open_form(self, name: str) -> None:
        """Show job ``name``'s form with the cursor in its first field (enter on the list, ``t``, the palette).

        Returns once the cursor is there, so a key typed right after it lands in the form.
        """
        form = self._show_form(name)
        if form is None:
            return
        building = self._forms_being_built.get(form)
        if building is not None:
            await building  # its fields exist once it is built
        if form.is_mounted and self.current_form is form:
            form.focus_first()

    def _show_form(self, name: str) -> ParamForm | None:
        if name not in self.dashboard.session.job_specs:
            self.app.notify(f"job {name!r} is not installed", severity="error")
            return None
        job_list = self.query_one("#job-list", OptionList)
        job_list.highlighted = job_list.get_option_index(name)
        form = self.form_for(name)
        self.query_one("#forms", ContentSwitcher).current = form_id(name)
        return form

    def _runtime_changed(self, runtime) -> None:
        for form in self.query(ParamForm):
            if form.is_mounted:  # a form still being built validates itself on mount
                form.validate()

    # -- launching ----------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        focused = self.focused
        if action == "launch":
            return isinstance(focused, Input) or (isinstance(focused, Button) and focused.has_class("launch"))
        if action == "open_highlighted":
            return focused is not None and focused.id == "job-list"
        if action == "open_choices":
            return isinstance(focused, Select)  # not its open list: there enter picks, as Textual's own binding does
        if action == "toggle_switch":
            return isinstance(focused, Switch)
        return True

    def action_open_choices(self) -> None:
        if isinstance(self.focused, Select):
            self.focused.action_show_overlay()

    def action_toggle_switch(self) -> None:
        if isinstance(self.focused, Switch):
            self.focused.action_toggle_switch()

    async def action_open_highlighted(self) -> None:
        job_list = self.query_one("#job-list", OptionList)
        if job_list.highlighted is not None:
            option_id = job_list.get_option_at_index(job_list.highlighted).id
            if option_id is not None:
                await self.open_form(option_id)

    async def action_launch(self) -> None:
        form = self.current_form
        if form is None:
            return
        building = self._forms_being_built.pop(form, None)
        if building is not None:
            # Enter typed ahead of a form still being built (down, enter):
            # launch that form once its fields exist.
            await building
        self._launch(form)

    def on_param_form_launch_requested(self, event: ParamForm.LaunchRequested) -> None:
        event.stop()
        self._launch(event.form)

    def _launch(self, form: ParamForm) -> None:
        params = form.validate()
        if params is None:
            problems = "; ".join(f"{name}: {message}" if name else message for name, message in form.errors.items())
            self.app.notify(problems, title=f"{form.spec.name} not launched", severity="error")
            invalid = form.first_invalid()
            if invalid is not None:
                invalid.input.focus()
            return
        self.dashboard.session.launch(form.spec, params)

    def action_focus_list(self) -> None:
        self.query_one("#job-list", OptionList).focus()

    def _show_lane(self, _version: int = 0) -> None:
        lane = self.dashboard.session.lane
        current = lane.current
        waiting = lane.waiting
        text = Text("lane: ", style="bold")
        if current is None:
            text.append("idle", "dim")
        else:
            text.append(f"{current.job} running", "bold yellow")
        if waiting:
            text.append("   queued: " + ", ".join(f"{position}. {run.job}" for position, run in enumerate(waiting, 1)))
        self.query_one("#lane-line", Static).update(text)
