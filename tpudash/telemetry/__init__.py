"""Telemetry beside a run: libtpu's metrics service (tpu-info), the host (psutil), sampling and recording."""
