"""The bus: how a run is laid out on disk, written, tailed, listed, followed and exported.

Every run — a tpudash job in the engine, the user's ``fit`` with the callback,
a loop with ``tpudash.record`` — is a directory read the same way. Nothing
here imports Textual or TensorFlow.
"""
