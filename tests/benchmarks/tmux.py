"""The dashboard in a real terminal, driven as a user drives it: a detached tmux session, keys, the pane's text.

``TmuxTerminal`` starts a command in ``tmux new-session -d -x COLS -y ROWS``
on a tmux server of its own (``-L``: nothing of the user's sessions is
touched), sends keys with ``tmux send-keys`` and reads the pane with ``tmux
capture-pane -p``. Waiting is a bounded poll of the pane (or of a process)
with a deadline: tmux has no way to say "the pane changed".
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

POLL_SECONDS = 0.002
"""Between two looks at the pane: well under a frame, and each look is one tmux client (~2 ms)."""


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


class TmuxTerminal:
    """One command in a detached tmux session (its own server); ``with`` ends both."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        size: tuple[int, int] = (160, 48),
        cwd: str | None = None,
    ):
        self.socket = f"tpudash-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.session = "bench"
        columns, rows = size
        # The command's environment travels in the command line: a tmux server keeps its own.
        assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        command = f"exec env {assignments} {shlex.join(argv)}"
        self._tmux(
            "new-session", "-d", "-s", self.session, "-x", str(columns), "-y", str(rows), *(["-c", cwd] if cwd else []),
            command,
        )  # fmt: skip
        self._tmux("set-option", "-t", self.session, "remain-on-exit", "on")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:2])}: {done.stderr.strip()}")
        return done.stdout

    def pane_pid(self) -> int:
        return int(self._tmux("display-message", "-p", "-t", self.session, "#{pane_pid}").strip())

    def exited(self) -> bool:
        """True once the command has ended (the pane stays, showing its last words)."""
        return self._tmux("display-message", "-p", "-t", self.session, "#{pane_dead}").strip() == "1"

    def capture(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.session)

    def send(self, *keys: str) -> None:
        """``tmux send-keys``: key names as tmux spells them (``q``, ``Enter``, ``?``)."""
        self._tmux("send-keys", "-t", self.session, *keys)

    def wait_for(self, shown: Callable[[str], bool], timeout: float, what: str) -> tuple[float, str]:
        """Poll the pane until ``shown(text)``: (perf_counter when seen, the text); RuntimeError at the deadline."""
        deadline = time.perf_counter() + timeout
        while True:
            text = self.capture()
            now = time.perf_counter()
            if shown(text):
                return now, text
            if now > deadline:
                raise RuntimeError(f"after {timeout:g} s the pane does not show {what}; it shows:\n{text[-1500:]}")
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, check=False)

    def __enter__(self) -> TmuxTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie waiting for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def wait_until_gone(pid: int, timeout: float) -> float:
    """Poll until process ``pid`` has exited: perf_counter then; RuntimeError at the deadline."""
    deadline = time.perf_counter() + timeout
    while not process_gone(pid):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"process {pid} still running after {timeout:g} s")
        time.sleep(POLL_SECONDS)
    return time.perf_counter()
