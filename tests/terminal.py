"""A command on a pseudo-terminal, as a user starts it: for the tests and benchmarks that need a real terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_on_a_terminal(argv: list[str], env: dict, timeout: float = 60, cwd: str | None = None) -> tuple[int, bytes]:
    """Run ``argv`` on a pseudo-terminal (120×40) until it exits: its exit code and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True, cwd=cwd)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"{argv} still running after {timeout} s: {output[-500:]!r}")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        return process.wait(timeout=timeout), output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
