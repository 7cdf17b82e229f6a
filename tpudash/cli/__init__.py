"""The headless front end: ``tpudash`` commands, their renderers and the run sinks."""
