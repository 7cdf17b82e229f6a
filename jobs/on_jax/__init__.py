"""The jobs on JAX: each module here is the JAX runner of a job whose spec, params and reports live in ``jobs``.

A ``JobSpec``'s ``run_jax`` points here; the engine calls it when its
runtime is JAX's (``Runtime.framework == "jax"``: ``ctx.runtime.strategy`` is
a ``jax.sharding.Mesh`` with one axis over every device, and
``ctx.runtime.logical_devices`` is ``jax.devices()``). Like the TensorFlow
runners, a module here imports JAX inside its functions only: listing jobs
stays instant and imports no framework.
"""
