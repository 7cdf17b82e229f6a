"""The command palette: every job (launch, or open its form), every screen, and the engine's controls.

Commands call the app's actions, so the palette, the keys and the tests all
go through one path.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tpudash.tui.modes import MODE_SCREENS

if TYPE_CHECKING:
    from tpudash.tui.session import DashboardSession


class PaletteApp(Protocol):
    """What the palette needs of the app (named here, since the app imports this module)."""

    session: DashboardSession

    async def run_action(self, action: str, default_namespace: Any = None) -> bool: ...

    def action_release_engine(self) -> None: ...

    def action_reinitialize_runtime(self) -> None: ...

    def action_cancel_job(self) -> None: ...

    def action_use_framework(self, choice: str) -> None: ...

    def action_watch_live(self) -> None: ...


def on_run_screen(app: PaletteApp, action: str) -> None:
    """A run view's key (``p``: profile, ``a``: advice) for the run on screen; elsewhere, where to go first."""
    screen = cast(Any, app).screen
    if hasattr(screen, action):
        getattr(screen, action)()
    else:
        cast(Any, app).notify("Open a run first (v: this session's runs, h: History, w: the newest live run).")


FRAMEWORK_HELP = {
    "auto": "TensorFlow where it is installed, else JAX: a new engine on it",
    "tensorflow": "a new engine that runs every job with TensorFlow (tf.distribute)",
    "jax": "a new engine that runs every job with JAX (a mesh over jax.devices()); jobs without a JAX runner say why",
}


def framework_commands(app: PaletteApp) -> list[tuple[str, Callable, str]]:
    """One entry per framework the session is not set to: ``Framework: run jobs on JAX (re-initialise)``."""
    from tpudash.config import FRAMEWORK_CHOICES, FRAMEWORK_NAMES

    current = app.session.settings.framework
    return [
        (
            f"Framework: run jobs on {FRAMEWORK_NAMES.get(choice, 'the automatic choice')} (re-initialise)",
            partial(app.action_use_framework, choice),
            f"now {current}; {FRAMEWORK_HELP[choice]}",
        )
        for choice in FRAMEWORK_CHOICES
        if choice != current
    ]


class TpudashCommands(Provider):
    """Jobs, screens, cancel, release the accelerator, re-initialise the runtime."""

    def _commands(self) -> list[tuple[str, Callable, str]]:
        app = cast(PaletteApp, self.app)
        commands: list[tuple[str, Callable, str]] = []
        for name, spec in app.session.job_specs.items():
            commands.append(
                (
                    f"Run {name}",
                    partial(app.run_action, f"launch_job({name!r})"),
                    f"{spec.title}: launch with default params",
                )
            )
            commands.append(
                (
                    f"Form: {name}",
                    partial(app.run_action, f"open_form({name!r})"),
                    f"{spec.title}: set params, then enter to launch",
                )
            )
        for mode, (_, _, label, help_text) in MODE_SCREENS.items():
            commands.append((f"Show {label}", partial(app.run_action, f"show({mode!r})"), help_text))
        commands.append(
            (
                "Release the accelerator (the engine exits)",
                app.action_release_engine,
                "so a notebook or another process can take the TPU; the next launch starts a new engine",
            )
        )
        commands.append(
            (
                "Re-initialise the TPU (detect the runtime again)",
                app.action_reinitialize_runtime,
                "a new engine: connect, initialize the TPU system and rebuild the strategy",
            )
        )
        commands.extend(framework_commands(app))
        commands.append(("Cancel the running job", app.action_cancel_job, "stop the job on the accelerator lane"))
        commands.append(
            (
                "Profile this run",
                partial(on_run_screen, app, "action_profile_shown"),
                "the run shown (p in the run view): its writer profiles the next steps; XProf's summary in its Profile tab",
            )
        )
        commands.append(
            (
                "Advice for this run",
                partial(on_run_screen, app, "action_advice_shown"),
                "the run shown (a in the run view): the TPU checklist judged for it, each pitfall with its fix; MFU",
            )
        )
        commands.append(
            (
                "Watch the newest live run",
                app.action_watch_live,
                "your own model.fit with TpudashCallback, tpudash.record, or a run in another terminal",
            )
        )
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
