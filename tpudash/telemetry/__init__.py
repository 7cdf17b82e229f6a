"""Telemetry beside a run: is the TPU busy, and is the host keeping up?

- ``sources``: libtpu's metrics service (gRPC, through tpu-info) and this host (psutil), read as plain values;
- ``tensorcore``: TensorCore utilisation from libtpu's SDK, in a child process (both sides of it);
- ``sampling``: one ``jobs.events.Telemetry`` sample of every source, on request or every interval;
- ``recorder``: samples appended to each live run's telemetry.jsonl, one observer per run.

What the samples say (summaries, the idle-TPU advice) is read with the run: ``tpudash.runs.telemetry_samples``.
"""
