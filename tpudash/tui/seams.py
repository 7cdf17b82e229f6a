"""The two places tpudash depends on how Textual works inside, not on its documented API.

Everything else in the dashboard uses Textual's public API. These two have no
public way to do what they do, so they live here, each with the reason, and
``tests/unit/test_textual_seams.py`` fails as soon as a Textual release
changes what they rely on: an upgrade then says what to look at instead of
breaking the dashboard quietly. Written against Textual 8.2.

- ``guard_option_list_page_keys``: a page key reaching an OptionList before its
  first layout (a Select's list just opened) raises KeyError inside Textual and
  takes the app down. The list lives inside Select, so no subclass of ours can
  replace it.
- ``UndelayedRevisits``: ``App.switch_mode`` holds every frame for 50 ms
  through ``App.delay_update`` to hide a screen still composing. A mode shown
  before is composed and kept, so that delay is pure key latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.widgets import OptionList

# To the type checker the mixin is an App (it calls App's methods); at run
# time it is a plain class placed before App in the app's bases.
if TYPE_CHECKING:
    from textual.app import App

    _MixedIntoApp = App[Any]
else:
    _MixedIntoApp = object

_GUARDED = "_tpudash_page_keys_guarded"
TEXTUAL_MOVE_PAGE = OptionList._move_page
"""Textual's own page move, kept so a test can tell when a release no longer needs the guard."""


def guard_option_list_page_keys() -> None:
    """Until an OptionList is laid out, pageup/pagedown on it do nothing (Textual 8.2 raises KeyError).

    Found by the random-key soak (tests/functional/test_app_soak.py). Safe to call more than once.
    """
    if getattr(OptionList, _GUARDED, False):
        return
    move_page = TEXTUAL_MOVE_PAGE

    def move_page_once_laid_out(self, direction):
        # _index_to_line is filled by the first layout; before it, any page
        # move would look up a line that does not exist yet.
        if (self.highlighted or 0) not in self._index_to_line:
            return
        move_page(self, direction)

    OptionList._move_page = move_page_once_laid_out  # type: ignore[method-assign]  # the seam: Textual patched
    setattr(OptionList, _GUARDED, True)


class UndelayedRevisits(_MixedIntoApp):
    """An App mixin: ``switch_mode_undelayed`` skips Textual's 50 ms hold for a mode shown before.

    Mix in before ``App`` (``class MyApp(UndelayedRevisits, App)``). Relies on
    ``App.switch_mode`` calling ``App.delay_update`` while it switches.
    """

    _skip_delay = False
    _modes_shown: set[str] | None = None

    async def switch_mode_undelayed(self, mode: str) -> None:
        """``switch_mode(mode)``; drawn at the next frame when ``mode`` was shown before."""
        shown = self._modes_shown
        if shown is None:
            shown = self._modes_shown = {self.current_mode}
        self._skip_delay = mode in shown
        try:
            await self.switch_mode(mode)
        finally:
            self._skip_delay = False
        shown.add(mode)

    def delay_update(self, delay: float = 0.05) -> None:
        if self._skip_delay:
            return
        super().delay_update(delay)
