"""Benchmarks of the performance targets; not part of the default test run."""
