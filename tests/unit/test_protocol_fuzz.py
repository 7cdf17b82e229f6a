"""Property tests of the child protocols' boundary: whatever arrives, nothing raises past it but ProtocolError.

The engine protocol's ``decode`` takes any JSON object and returns a message
or raises ``ProtocolError`` naming what is wrong; ``tpudash.childproc``'s
``decode_line`` takes any text and returns an object or None; its
``LineReader`` reads any bytes a child writes, delivers the objects, keeps
the rest as noise and ends; the engine's ``serve`` loop reads any command
lines and hands on only messages that decoded. The example count comes from
the Hypothesis profile (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import io
import threading

from hypothesis import given
from hypothesis import strategies as st

from tpudash.childproc import ID_FIELD, LineReader, decode_line, encode_line
from tpudash.engine.protocol import COMMANDS, REPLIES, Command, ProtocolError, decode, encode
from tpudash.engine.server import serve

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
KINDS = {**COMMANDS, **REPLIES}
FIELD_NAMES = sorted({field.name for kind in KINDS.values() for field in dataclasses.fields(kind)} | {ID_FIELD})
# Mostly messages of a known type whose fields are present with any value: the checks are then what decides.
PAYLOADS = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(KINDS)) | JSON_VALUES},
    optional={name: JSON_VALUES | st.text(max_size=20) for name in FIELD_NAMES},
) | st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=5)


@given(PAYLOADS, st.sampled_from([COMMANDS, REPLIES]))
def test_decode_returns_a_message_of_the_asked_kinds_or_raises_protocol_error(payload, kinds):
    try:
        message = decode(payload, kinds)
    except ProtocolError as error:
        assert str(error)
        return
    assert type(message) in kinds.values()
    # What decoded is what the protocol says: it crosses the pipe again unchanged.
    assert decode(decode_line(encode_line(encode(message))), kinds) == message


@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda data: data.decode("utf-8", "replace")))
def test_decode_line_returns_an_object_or_none_for_any_text(line):
    payload = decode_line(line)
    assert payload is None or isinstance(payload, dict)


def lines_of(payloads: list, junk: list[bytes]) -> bytes:
    """Protocol lines and junk interleaved, as a child's stdout may carry them."""
    out = b""
    for index, payload in enumerate(payloads):
        out += encode_line(payload).encode()
        if index < len(junk):
            out += junk[index]
    return out


@given(st.lists(PAYLOADS, max_size=6), st.lists(st.binary(max_size=40), max_size=6))
def test_the_line_reader_delivers_objects_keeps_the_rest_as_noise_and_ends(payloads, junk):
    stream = io.TextIOWrapper(io.BytesIO(lines_of(payloads, junk)), encoding="utf-8", errors="replace")
    delivered: list = []
    ended = threading.Event()

    def deliver(payload):
        delivered.append(payload)
        decode(payload, REPLIES)  # a ProtocolError (a ValueError) keeps the line as noise, as the handle does

    reader = LineReader(stream, deliver, name="fuzz-reader", on_end=ended.set).start()
    assert ended.wait(30)
    reader.join(30)
    assert not reader.alive
    assert all(isinstance(payload, dict) for payload in delivered)
    assert len(delivered) >= len(payloads) - len(junk)  # junk may tear at most one line each


class RecordingServer:
    """The engine's server reduced to what ``serve`` asks of it: the commands it is handed."""

    def __init__(self, send):
        self.send = send
        self.handled: list = []
        self.stopped = False

    def start(self) -> bool:
        return True

    def handle(self, command, request_id=None) -> None:
        self.handled.append(command)

    def stop(self) -> None:
        self.stopped = True


@given(st.lists(PAYLOADS.map(encode_line) | st.text(max_size=60), max_size=8))
def test_the_engines_loop_reads_any_lines_and_hands_on_only_commands(lines):
    servers: list[RecordingServer] = []
    replies = io.StringIO()

    def make_server(send):
        servers.append(RecordingServer(send))
        return servers[0]

    serve(io.StringIO("".join(line if line.endswith("\n") else line + "\n" for line in lines)), replies, make_server)
    assert servers[0].stopped
    assert all(isinstance(command, Command) for command in servers[0].handled)
    for reply in replies.getvalue().splitlines():  # only refusals of launches it could not read
        assert decode(decode_line(reply), REPLIES).TYPE == "refused"
