"""Small modal dialogs: a yes/no question such as "a job is running, quit anyway?".

A dialog shows over the screen it was asked on, dimmed: the user still sees
the run they are about to cancel. The answer that loses nothing is the
default (focused): "keep running" before quitting; "run on the CPU" when
another process holds the TPU.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from tpudash.tui.seams import being_taken_down


class ConfirmScreen(ModalScreen[bool]):
    """Ask a question; dismisses with True for yes (``y``), False for no (``n``/escape); enter: the focused one."""

    # Not in DEFAULT_CSS: the app's ``Screen { background: … }`` outranks any
    # default rule and would paint the dialog's whole screen opaque, hiding
    # the screen behind; a screen's own CSS ranks with the app's and comes later.
    CSS = """
    ConfirmScreen { background: $background 60%; }
    """
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 60;
        max-width: 95%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    ConfirmScreen .question { margin: 0 0 1 0; }
    ConfirmScreen Horizontal { height: auto; align: center middle; }
    ConfirmScreen Button { margin: 0 1; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n", "answer(False)", "No", id="confirm.no"),
        Binding("escape", "answer(False)", "No", id="confirm.escape", show=False),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No", *, default_yes: bool = False):
        """``default_yes``: yes is focused and looks safe (a choice that loses nothing); else no is, and yes warns."""
        super().__init__()
        self.question = question
        self.yes_label = yes
        self.no_label = no
        self.default_yes = default_yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, classes="question", markup=False)
            with Horizontal():
                yield Button(f"{self.yes_label} (y)", variant="primary" if self.default_yes else "error", id="yes")
                yield Button(f"{self.no_label} (n)", variant="default" if self.default_yes else "primary", id="no")

    def on_mount(self) -> None:
        if being_taken_down(self):
            return  # asked and answered (or escaped) before it mounted: its buttons are gone already
        self.query_one("#yes" if self.default_yes else "#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
