"""``libtpu.sdk`` of the stand-in: only ``monitoring.get_metric``."""

import os
import signal
import types


class _Metric:
    def __init__(self, name: str):
        self.name = name

    def data(self) -> list[str]:
        mode = os.environ.get("FAKE_LIBTPU", "values")
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "error":
            raise RuntimeError(f"metric {self.name} is not supported by this libtpu")
        return [value for value in os.environ.get("FAKE_TENSORCORE_UTIL", "").split(",") if value]


monitoring = types.SimpleNamespace(get_metric=_Metric)
