"""A stand-in for libtpu on PYTHONPATH, for ``tpudash.telemetry.tensorcore.TensorCoreProbe``'s tests.

``FAKE_LIBTPU=values`` serves ``FAKE_TENSORCORE_UTIL`` (comma-separated
percentages, one per core) as ``sdk.monitoring.get_metric("tensorcore_util")``;
``FAKE_LIBTPU=crash`` dies of SIGSEGV there, as libtpu 0.0.17 does on a host
without chips; ``FAKE_LIBTPU=error`` raises RuntimeError, as an SDK without
the metric does; ``FAKE_LIBTPU=chatty`` prints on stdout at import and at
each read; ``FAKE_LIBTPU=late`` holds its first answer (all 99s) until the
file ``FAKE_LIBTPU_GATE`` exists.
"""
