"""The bus: how a run is laid out on disk, written, tailed, listed, followed and exported.

Every run — a tpudash job in the engine, the user's ``fit`` with the callback,
a loop with ``tpudash.record`` — is a directory (or a prefix in a bucket) read the same way. Nothing
here imports Textual or TensorFlow, nor the telemetry samplers that write
into a run (they import this package, not the other way round).

- ``location``: a runs directory, a path or a store URL (gs://, s3://, memory://);
- ``backends``: a run's files on disk or in a bucket (``RunFiles``), the runs of a root;
- ``layout``: file names, run ids, statuses, sources, atomic run.json writes;
- ``recorder``: ``RunRecorder``, the writer of one local run;
- ``uploader``: ``StoreRecorder``, the writer of one run in a store, over ``segment_writer`` (its streams as
  segments, outages and spill) and ``spill`` (its local directory);
- ``segments``: ``StreamTail``, a run's events in both layouts, a piece at a time: ``appended`` (the
  appended file), ``segment_listing`` (which segments, in what order), ``prefetch`` (a follower's thread);
- ``transfer``: runs copied between runs directories (``tpudash copy``);
- ``tail``: ``LineTail`` (whole lines of a growing file) and ``EventTail``;
- ``liveness``: whether a run's writer is still writing (its flock, its heartbeat; pid and psutil for older runs);
- ``store``: ``RunStore``, the facade for writing, listing, finding and loading runs, over ``records``
  (reading one run's record), ``judge`` (whether running runs' writers live, a store's at once) and
  ``writing`` (creating, joining and ending runs);
- ``export`` and ``export_stream``: a run as CSV or JSON; ``telemetry_samples``: what its samples say;
- ``follow``: a run followed as it grows, the runs directory watched;
- ``model`` and ``series``: what a run's events add up to, in bounded memory.
"""
