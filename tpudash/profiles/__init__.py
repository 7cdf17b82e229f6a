"""Profiles of a live run: asked for over the bus, captured by the run's writer, read with XProf.

``requests`` (the request and answer objects in a run), ``capture`` (the writer's side: step
markers, the framework's profiler, the capture placed where XProf looks), ``convert`` (XProf in a
child process: a capture to ``summary.json``) and ``summary`` (the summary read back, a run's
captures listed). Nothing here imports TensorFlow, JAX or xprof at import time.
"""
