"""``python -m tpudash.profiles.attach_child HOST:PORT LOGDIR DURATION_MS``: a capture by duration, in a child.

What ``capture_tpu_profile`` did: ask the profiler server of a running process
(``tf.profiler.experimental.server.start(port)``, ``jax.profiler.start_server(port)``)
for ``DURATION_MS`` of trace, written to ``LOGDIR/plugins/profile/<ts>/<host>.xplane.pb``.
It uses xprof's client (C++ through ctypes; no TensorFlow, starts in a fraction of a
second), else TensorFlow's (``tf.profiler.experimental.client.trace``). No module imports
this one: ``tpudash profile --attach`` runs it (``tpudash.cli.profiling``), so neither xprof
nor TensorFlow enters the CLI's process, and their native chatter stays in the child's stderr.
Exit 0 when the server answered, 1 with the error's last line on stderr.
"""

from __future__ import annotations

import sys

# The client's own retries: one, so a wrong address answers in a second, not after minutes.
TRACING_ATTEMPTS = 1


def trace(address: str, logdir: str, duration_ms: int) -> None:
    try:
        from xprof.convert import _pywrap_profiler_plugin
    except ImportError:
        import tensorflow as tf

        tf.profiler.experimental.client.trace(f"grpc://{address}", logdir, duration_ms, num_tracing_attempts=1)
        return
    _pywrap_profiler_plugin.trace(address, logdir, "", True, duration_ms, TRACING_ATTEMPTS, {})


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tpudash.profiles.attach_child HOST:PORT LOGDIR DURATION_MS", file=sys.stderr)
        return 2
    address, logdir, duration = argv
    try:
        trace(address, logdir, int(duration))
    except Exception as error:  # noqa: BLE001 - the parent reads the last line and says it
        text = " ".join(str(error).split()) or type(error).__name__
        print(f"{type(error).__name__}: {text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
