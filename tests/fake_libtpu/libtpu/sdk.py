"""``libtpu.sdk`` of the stand-in: only ``monitoring.get_metric``."""

import os
import signal
import sys
import types

MODE = os.environ.get("FAKE_LIBTPU", "values")
if MODE == "chatty":
    print("libtpu: a line the SDK prints at import")
_reads = 0


class _Metric:
    def __init__(self, name: str):
        self.name = name

    def data(self) -> list[str]:
        global _reads
        _reads += 1
        if MODE == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE == "error":
            raise RuntimeError(f"metric {self.name} is not supported by this libtpu")
        if MODE == "chatty":
            # A line written straight to file descriptor 1, then a progress bar left without its newline.
            os.write(1, b"libtpu: a line written to fd 1\n")
            sys.stdout.write("reading tensorcore_util... 50%")
            sys.stdout.flush()
        if MODE == "late" and _reads == 1:
            # The first read answers, with values of its own, only once the test opens and closes
            # FAKE_LIBTPU_GATE (a named pipe: opening it for reading blocks until a writer comes).
            with open(os.environ["FAKE_LIBTPU_GATE"]) as gate:
                gate.read()
            return ["99"] * len(os.environ.get("FAKE_TENSORCORE_UTIL", "").split(","))
        return [value for value in os.environ.get("FAKE_TENSORCORE_UTIL", "").split(",") if value]


monitoring = types.SimpleNamespace(get_metric=_Metric)
