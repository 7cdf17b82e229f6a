"""Advice rules: the TPU pitfalls checklist (issue 40) judged from what a run knows.

Pure, Textual-free functions: ``rules`` holds the result type ``Advice`` and
the rules that need no TensorFlow (padding, small-batch, mixed-precision,
input-bound, recompiles); ``pipeline`` walks a tf.data dataset's graph
(TensorFlow is imported inside its functions only).
"""
