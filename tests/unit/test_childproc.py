"""The line protocol with tpudash's children: answers matched by id, a child's stray output, a child that ends.

Real child processes run small scripts: one holds an answer until the next
request arrives (an answer that comes after its request timed out), one
prints lines that are no protocol lines, one exits or is killed mid-request.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT
from tpudash.childproc import AnswerTimeout, ChildGone, RequestChannel, decode_line, encode_line

WAIT = 30.0


def child(script: str, **options) -> RequestChannel:
    """A child running ``script`` (which may import tpudash), its stderr discarded unless given."""
    options.setdefault("stderr", subprocess.DEVNULL)
    return RequestChannel(
        [sys.executable, "-c", textwrap.dedent(script)], name="test-child-reader", cwd=REPO_ROOT, **options
    )


# Answers each request with its own "n", but holds an answer while told to, until the next request arrives.
HOLDING_CHILD = """
    import json, sys
    held = []
    for line in sys.stdin:
        request = json.loads(line)
        answer = json.dumps({"id": request["id"], "n": request["n"]}) + "\\n"
        if request.get("hold"):
            held.append(answer)
            continue
        sys.stdout.write("".join(held) + answer)
        sys.stdout.flush()
        held.clear()
"""


def test_an_answer_that_comes_after_its_request_timed_out_is_never_taken_for_the_next_ones():
    channel = child(HOLDING_CHILD)
    try:
        with pytest.raises(AnswerTimeout):
            channel.request({"n": 1, "hold": True}, timeout=0.2)
        # The child now answers 1 (late) and then 2: only 2 is the answer to 2.
        assert channel.request({"n": 2}, timeout=WAIT)["n"] == 2
        assert channel.request({"n": 3}, timeout=WAIT)["n"] == 3
    finally:
        channel.kill()


def test_lines_that_are_not_protocol_lines_are_skipped_and_kept_for_diagnostics():
    channel = child("""
        import json, sys
        for line in sys.stdin:
            request = json.loads(line)
            print("Loading libtpu from /usr/lib (a library printing)")
            print("[1, 2, 3]")
            print('{"truncated": ')
            print('{"id": %d, "value": "the answer"}' % request["id"], flush=True)
    """)
    try:
        assert channel.request({}, timeout=WAIT)["value"] == "the answer"
        assert channel.noise == ["Loading libtpu from /usr/lib (a library printing)", "[1, 2, 3]", '{"truncated": ']
    finally:
        channel.kill()


def test_a_child_that_exits_or_is_killed_before_answering_says_how_it_ended():
    exiting = child("import sys; sys.stdin.readline(); sys.exit(3)")
    with pytest.raises(ChildGone) as gone:
        exiting.request({}, timeout=WAIT)
    assert gone.value.returncode == 3
    with pytest.raises(ChildGone):  # and every later request at once
        exiting.request({}, timeout=WAIT)
    exiting.kill()

    killed = child("import os, signal, sys; sys.stdin.readline(); os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(ChildGone) as gone:
        killed.request({}, timeout=WAIT)
    assert gone.value.returncode == -signal.SIGSEGV
    killed.kill()


def test_the_childs_side_answers_with_the_id_and_keeps_a_librarys_prints_out_of_the_protocol(tmp_path):
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as child_stderr:
        channel = child(
            """
            import sys
            from tpudash.childproc import claim_stdout, serve_requests
            replies = claim_stdout()

            def answer(request):
                print("chatter on stdout", flush=True)
                return {"twice": request["x"] * 2}

            serve_requests(answer, sys.stdin, replies)
        """,
            stderr=child_stderr,
        )
        try:
            assert channel.request({"x": 21}, timeout=WAIT)["twice"] == 42
            assert channel.request({"x": 1}, timeout=WAIT)["twice"] == 2
            assert channel.noise == []
        finally:
            assert channel.finish(WAIT) == 0  # its stdin closed, its loop ended
    assert stderr.read_text().splitlines() == ["chatter on stdout"] * 2


def test_a_line_is_one_json_object_and_anything_else_is_no_protocol_line():
    assert decode_line(encode_line({"type": "hello", "id": 3})) == {"type": "hello", "id": 3}
    for line in ("", "\n", "plain text\n", "[1]\n", "3\n", '"text"\n', '{"broken\n', "[" * 100_000 + "\n"):
        assert decode_line(line) is None


def test_a_child_that_outlives_the_parent_it_expected_exits_at_once():
    # The TPU probe's guard: its parent died before the kernel was asked to end it with its parent.
    code = (
        "import signal; from tpudash.childproc import parent_death_signal; "
        "parent_death_signal(signal.SIGKILL, expected_parent=1)(); print('still here')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=WAIT)
    assert (result.returncode, result.stdout) == (1, "")


# A launcher that starts a worker sharing its stdout, then waits. The worker says its pid, waits until its
# launcher is dead (its parent changes: the order under test, so it polls that, bounded), and only then ties
# itself to the launcher as `tpudash run --worker-index` does. Tied too late, it must end at once; a worker
# that went on would train with nobody to stop it, holding the TPU.
LAUNCHER_DEAD_BEFORE_THE_TIE = """
import os, subprocess, sys
worker = '''
import os, sys, time
from tpudash.engine.cluster import die_with_launcher
launcher = int(os.environ["TPUDASH_LAUNCHER_PID"])
print(os.getpid(), flush=True)
deadline = time.monotonic() + 30
while os.getppid() == launcher and time.monotonic() < deadline:
    time.sleep(0.005)
die_with_launcher(os.environ)
print("outlived its launcher", flush=True)
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", worker], env=dict(os.environ, TPUDASH_LAUNCHER_PID=str(os.getpid())))
sys.stdin.read()
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the parent-death signal and pidfd are Linux's")
def test_a_launched_worker_dies_with_its_launcher_killed_before_it_tied_itself():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER_DEAD_BEFORE_THE_TIE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert launcher.stdout is not None
    worker_pid = int(launcher.stdout.readline())
    worker = os.pidfd_open(worker_pid)  # opened while the worker is alive: it is this worker, whatever comes
    try:
        launcher.kill()
        # A pidfd turns readable when its process has exited: a bounded wait on the worker's own end.
        ended, _, _ = select.select([worker], [], [], WAIT)
        assert ended, f"the worker (pid {worker_pid}) was still running {WAIT:g} s after its launcher was killed"
        remaining, _ = launcher.communicate(timeout=WAIT)
        assert remaining == ""  # it never went on past the tie
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(worker, signal.SIGKILL)  # a worker that outlived the test ends with it
        os.close(worker)
        launcher.kill()
        launcher.wait()
