"""The param form: one field per job param, validated as the user types, and a launch button.

A job declares its params (``jobs.base.Param``); the form is built from that
declaration, so a new param needs no UI code. Errors name the field and what
is allowed, and a param that has no effect under the others' values is hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Label, Select, Static, Switch

from jobs.base import JobSpec, Param, ParamError


def _param_widget(param: Param) -> Input | Select | Switch:
    # Compact (one line, no border): a form of sixteen fields fits a 24-line terminal.
    if param.kind == "bool":
        return Switch(value=bool(param.default), classes="param-input")
    if param.choices:
        options = [(str(choice), choice) for choice in param.choices]
        default = param.default if param.default in param.choices else param.choices[0]
        return Select(options, value=default, allow_blank=False, compact=True, classes="param-input")
    # Plain text on purpose: a number-only Input would silently swallow a bad
    # key, where the user should see what is wrong and what is allowed.
    return Input(value=param.format(param.default), placeholder=param.allowed(), compact=True, classes="param-input")


class ParamField(Vertical):
    """One param on one line, its name beside its input; what it allows and its help
    below while it has focus (always on a tall screen); its error below when it has one.

    A param that has no effect with the other params' current values
    (``Param.applies_when``) is hidden, unless its value is wrong.
    """

    # A scoped rule is prefixed with "ParamField", so one about the screen's height could never match.
    SCOPED_CSS = False
    DEFAULT_CSS = """
    ParamField {
        height: auto;
    }
    /* On the field itself too, so Textual restyles its label and help when the focus moves in or out. */
    ParamField:focus-within { background: $boost; }
    ParamField .param-row { height: auto; }
    ParamField .param-label { color: $text-primary; text-style: bold; padding: 0 1 0 0; }
    ParamField:focus-within .param-label { color: $text-accent; text-style: bold reverse; }
    ParamField .param-input { width: 1fr; }
    ParamField Input.param-input { background: $boost; }
    ParamField Input.param-input:focus { background: $primary 25%; }
    ParamField Switch.param-input { width: auto; height: 1; border: none; padding: 0 1; }
    ParamField .param-switch-state { width: 1fr; padding: 0 1; }
    ParamField .param-help { color: $text-muted; display: none; }
    ParamField:focus-within .param-help { display: block; }
    Screen.-tall ParamField .param-help { display: block; }
    ParamField .param-error { color: $text-error; display: none; }
    ParamField.-invalid .param-error { display: block; }
    ParamField.-invalid .param-input { background: $error 30%; }
    ParamField.-inapplicable { display: none; }
    ParamField.-inapplicable.-invalid { display: block; }
    """

    def __init__(self, param: Param, label_width: int | None = None):
        super().__init__()
        self.param = param
        self.input = _param_widget(param)
        self.label_width = label_width or len(param.name) + 1

    def compose(self) -> ComposeResult:
        with Horizontal(classes="param-row"):
            label = Label(self.param.name, classes="param-label", markup=False)
            label.styles.width = self.label_width
            yield label
            yield self.input
            if isinstance(self.input, Switch):
                # A one-line switch is a small bar; the word says which way it is set.
                yield Label(self.param.format(self.input.value), classes="param-switch-state")
        help_text = Text(self.param.allowed(), style="italic")
        if self.param.help:
            help_text.append(f" · {self.param.help}")
        yield Static(help_text, classes="param-help")
        yield Static("", classes="param-error", markup=False)

    def on_switch_changed(self, event: Switch.Changed) -> None:
        self.query_one(".param-switch-state", Label).update(self.param.format(event.value))

    @property
    def raw_value(self) -> Any:
        """What the user entered: text for an Input, the choice or bool otherwise."""
        return self.input.value

    @property
    def error(self) -> str | None:
        return getattr(self, "_error", None)

    @property
    def applies(self) -> bool:
        """False while the other params' values make this one have no effect (it is hidden then)."""
        return not self.has_class("-inapplicable")

    def mark(self, message: str | None) -> None:
        self._error = message
        self.set_class(message is not None, "-invalid")
        self.query_one(".param-error", Static).update(message or "")


class FormMessage(Message):
    """A message about one ParamForm, which is its ``control`` (for ``@on(..., "#form-id")``)."""

    def __init__(self, form: ParamForm):
        super().__init__()
        self.form = form

    @property
    def control(self) -> ParamForm:
        return self.form


class ParamForm(VerticalScroll, can_focus=False):
    """A form generated from a job's Params; validates as the user types.

    Each field is parsed with ``Param.parse``; when every field parses, the
    whole set goes through ``spec.resolve`` (rules across fields) and, once
    the runtime is known, ``spec.check_runtime``. ``params`` holds the typed
    values when everything is valid, else None; ``errors`` maps field names
    (or "" for the form as a whole) to their messages.

    Whatever has focus inside the form (a field, a select, a switch, a
    button), a character typed there is the user's typing: it never reaches
    the app's one-letter keys (``c`` cancel, ``q`` quit, …).
    """

    DEFAULT_CSS = """
    ParamForm {
        height: 1fr;
        padding: 0 1;
    }
    ParamForm .form-title { text-style: bold; color: $text-accent; }
    ParamForm .form-description { color: $text-muted; }
    ParamForm .form-framework { color: $text-warning; }
    ParamForm .form-error { color: $text-error; display: none; }
    ParamForm.-invalid .form-error { display: block; }
    ParamForm .form-actions { height: auto; margin: 1 0 0 0; }
    ParamForm .form-actions Button { margin: 0 1 0 0; }
    """

    class Validated(FormMessage):
        """The form was checked again; ``form.params`` is None while anything is invalid."""

    class LaunchRequested(FormMessage):
        """The user asked to launch the job this form describes."""

    def __init__(
        self,
        spec: JobSpec,
        runtime: Callable[[], Any] | None = None,
        *,
        not_here: Callable[[JobSpec], str | None] | None = None,
        id: str | None = None,
    ):
        """``runtime``: the engine's, once known (its checks); ``not_here``: why the job cannot run on the
        session's framework (``DashboardSession.not_on_framework``), which makes the form refuse to launch."""
        super().__init__(id=id)
        self.spec = spec
        self._runtime = runtime or (lambda: None)
        self._not_here = not_here or (lambda spec: None)
        label_width = max((len(param.name) for param in spec.params), default=0) + 2
        self.fields = [ParamField(param, label_width) for param in spec.params]
        self.params: dict | None = None
        self.errors: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble((self.spec.title, "bold"), "  ", (self.spec.name, "dim")), classes="form-title")
        yield Static(self.spec.description, classes="form-description", markup=False)
        if "jax" not in self.spec.frameworks():
            # Said whatever the session runs on: the job is never silently missing on JAX.
            yield Static(
                f"not on JAX: {self.spec.not_on_jax or 'no JAX runner'}", classes="form-framework", markup=False
            )
        yield from self.fields
        yield Static("", classes="form-error", markup=False)
        with Horizontal(classes="form-actions"):
            yield Button("Launch (enter)", variant="primary", compact=True, classes="launch")
            yield Button("Defaults", compact=True, classes="defaults")

    def on_mount(self) -> None:
        self.validate()

    def field(self, name: str) -> ParamField:
        for field in self.fields:
            if field.param.name == name:
                return field
        raise KeyError(name)

    def set_value(self, name: str, value: Any) -> None:
        """Fill one field as if the user had typed or chosen ``value``."""
        widget = self.field(name).input
        if isinstance(widget, Input):
            widget.value = value if isinstance(value, str) else self.field(name).param.format(value)
        else:
            widget.value = value
        self.validate()

    def reset(self) -> None:
        for field in self.fields:
            param = field.param
            if isinstance(field.input, Input):
                field.input.value = param.format(param.default)
            else:
                field.input.value = param.default
        self.validate()

    def validate(self) -> dict | None:
        """Check every field and the whole; mark what is wrong; return the params or None."""
        errors: dict[str, str] = {}
        raw: dict[str, Any] = {}
        for field in self.fields:
            raw[field.param.name] = field.raw_value
            try:
                field.param.parse(field.raw_value)
            except ParamError as error:
                errors[field.param.name] = error.message
        params = None
        not_here = self._not_here(self.spec)
        if not_here is not None:
            errors[""] = not_here
        if not errors:
            try:
                params = self.spec.resolve(raw)
                runtime = self._runtime()
                if runtime is not None and self.spec.check_runtime is not None:
                    self.spec.check_runtime(params, runtime)
            except ParamError as error:
                key = error.field if error.field in raw else ""
                errors[key] = error.message if key else str(error)
                params = None
        for field in self.fields:
            field.mark(errors.get(field.param.name))
            field.set_class(not field.param.applies(raw), "-inapplicable")
        form_error = errors.get("", "")
        self.set_class(bool(form_error), "-invalid")
        self.query_one(".form-error", Static).update(form_error)
        self.params, self.errors = params, errors
        self.post_message(self.Validated(self))
        return params

    def first_invalid(self) -> ParamField | None:
        return next((field for field in self.fields if field.error), None)

    def focus_first(self) -> None:
        """Put the cursor in the first field shown, now (``focus()`` would wait behind keys already typed)."""
        shown = next((field for field in self.fields if field.applies), None)
        if shown is not None:
            self.screen.set_focus(shown.input)

    def check_consume_key(self, key: str, character: str | None) -> bool:
        # Textual then drops the screen's and the app's bindings of every
        # character while focus is in the form (and from the keys line);
        # keys bound inside it (space on a switch or a select) still work.
        return character is not None and character.isprintable()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.validate()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.validate()

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self.validate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.LaunchRequested(self))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.has_class("defaults"):
            self.reset()
        else:
            self.post_message(self.LaunchRequested(self))
