"""An app that shows one run view of a ``RunModel``: the run view's tests drive it with Textual's pilot."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tpudash.runs.model import RunModel
from tpudash.tui.runview import RunView

DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(8)]
"""The eight logical CPU devices of the embedded default, as a run names them."""


class RunViewApp(App):
    """One ``RunView`` (id ``view``) of ``model``, filling the screen."""

    def __init__(self, model: RunModel) -> None:
        super().__init__()
        self.model = model

    def compose(self) -> ComposeResult:
        yield RunView(self.model, id="view")
