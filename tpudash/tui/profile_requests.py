"""The dashboard's side of a profile: ask a run's writer, wait for its answer, convert its capture (no Textual).

Everything here touches the bus or runs the converter's child, so the
Profile tab (``tpudash.tui.profiletab``) calls it on thread workers, never on
the UI thread. ``ProfileCalls`` bundles the calls the tab makes, so a test
hands it fakes (a writer that answers at will, a converter that fails);
the real ones are ``tpudash.profiles``' own: ``request_profile``,
``read_answer``, ``list_captures``, ``read_summary`` and
``summarize_run_capture`` (XProf in a child process, never here).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpudash.profiles.convert import summarize_run_capture
from tpudash.profiles.requests import PROFILE_FOLDER, ProfileAnswer, ProfileRequest, read_answer, request_profile
from tpudash.profiles.summary import CaptureInfo, ProfileSummary, list_captures, read_summary
from tpudash.runs.backends import RunFiles

ANSWER_POLL_SECONDS = 1.0
"""The answer is read at most this often while the tab waits for it (a read is a request in a bucket)."""
ANSWER_TIMEOUT_SECONDS = 600.0
"""How long the tab waits for the writer's last answer: slow steps or an epoch's evaluation come between."""
CONVERT_TIMEOUT_SECONDS = 120.0


def profile_dir(files: RunFiles) -> str:
    """The run's profile logdir as XProf takes it: a path on this host, else the run's URL."""
    if files.local_dir is not None:
        return str(files.local_dir / PROFILE_FOLDER)
    return f"{files.where.rstrip('/')}/{PROFILE_FOLDER}"


def trace_command(files: RunFiles) -> str:
    """The command that opens the full trace in XProf."""
    return f"xprof --logdir {profile_dir(files)}"


def cache_root() -> Path:
    """Where a bucket run's capture is downloaded to be converted (the CLI's place too)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "tpudash" / "profiles"


def summarize(files: RunFiles, capture: str) -> ProfileSummary:
    """The capture's summary: its summary.json, else converted now by XProf in a child (ProfileError: why not)."""
    return summarize_run_capture(files, capture, cache_root=cache_root(), timeout=CONVERT_TIMEOUT_SECONDS)


@dataclass
class ProfileCalls:
    """What the Profile tab calls, off the UI thread; a test replaces any of them."""

    request: Callable[[RunFiles, int], ProfileRequest] = request_profile
    answer: Callable[[RunFiles, str], ProfileAnswer | None] = read_answer
    captures: Callable[[RunFiles], list[CaptureInfo]] = list_captures
    summary: Callable[[RunFiles, str], ProfileSummary | None] = read_summary
    """An existing summary.json, or None (then ``summarize`` converts the capture)."""
    summarize: Callable[[RunFiles, str], ProfileSummary] = summarize
    poll_seconds: float = ANSWER_POLL_SECONDS
    answer_timeout: float = ANSWER_TIMEOUT_SECONDS
