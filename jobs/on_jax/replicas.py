"""The per-replica jobs on JAX: replica-matmul, replica-dataset and all-reduce with ``jax.shard_map`` over the mesh.

A replica is one device of the runtime's mesh (``ctx.runtime.strategy``, one
axis over every device), in mesh order. Each job builds per-device inputs as
its TensorFlow counterpart hands them to ``strategy.run``, maps a function over
them with ``jax.shard_map`` (one instance per device, collectives by the
axis' name), and hands what each device computed to the shared check in
``jobs.replicas``: the reference, the tables, the per-replica values, the
summary and the verdict are the same code on both frameworks.

- replica-matmul: the "Use TPUs" guide's a and b replicated (``P()``): every
  device multiplies the whole of them, and its product is its row of the
  output (``P(axis)``).
- replica-dataset: each step's per-replica inputs (``jobs.replicas.replica_dataset_plan``,
  TensorFlow's split of ``range(n).batch(…)``) put on their device, padded to
  ``per_replica`` (a short last batch leaves replicas with fewer or none).
- all-reduce: ``lax.axis_index + 1`` per device, ``lax.psum``/``lax.pmean``
  inside, ``jnp.sum``/``jnp.mean`` of the sharded array outside; the timed
  ``psum`` of a per-device buffer.
"""

from __future__ import annotations

from typing import Any

from jobs.all_reduce import AllReduceChecks, TimedAllReduce, check_all_reduce
from jobs.replicas import (
    check_replica_dataset,
    check_replica_matmul,
    replica_dataset_plan,
    replica_function,
)


class MeshReplicas:
    """The runtime's mesh as replicas: its devices in order, its axis, and per-device arrays put together."""

    def __init__(self, mesh: Any):
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        self.jax = jax
        self.mesh = mesh
        self.axis = mesh.axis_names[0]
        self.devices = list(mesh.devices.flat)
        self.split = PartitionSpec(self.axis)
        self.sharding = NamedSharding(mesh, self.split)

    @property
    def count(self) -> int:
        return len(self.devices)

    def from_blocks(self, blocks: list) -> Any:
        """One array whose row block ``i`` is ``blocks[i]``, put on replica ``i``'s device (no copy through another)."""
        placed = [self.jax.device_put(block, device) for block, device in zip(blocks, self.devices)]
        shape = (sum(block.shape[0] for block in blocks), *blocks[0].shape[1:])
        return self.jax.make_array_from_single_device_arrays(shape, self.sharding, placed)

    def per_replica(self, array: Any) -> list:
        """Each replica's row block of ``array`` (split along the mesh axis), as NumPy, in replica order."""
        import numpy as np

        return list(np.asarray(array).reshape(self.count, -1, *array.shape[1:]))

    def map(self, function: Any, in_specs: Any, out_specs: Any) -> Any:
        """``function`` as one jitted program with one instance per device (``jax.shard_map``)."""
        return self.jax.jit(self.jax.shard_map(function, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs))


def run_replica_matmul(ctx, params: dict) -> dict:
    """replica-matmul: the same a and b on every device, one product per device."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    replicas = MeshReplicas(ctx.runtime.strategy)
    # P(): each instance gets the whole of a and b, as strategy.run passes the same tensors to every replica.
    replicated_matmul = replicas.map(
        lambda a, b: jnp.matmul(a, b)[None], in_specs=(PartitionSpec(), PartitionSpec()), out_specs=replicas.split
    )

    def multiply_on_every_replica(host_a: Any, host_b: Any) -> list:
        products = replicated_matmul(host_a, host_b)
        return [product[0] for product in replicas.per_replica(products)]

    return check_replica_matmul(ctx, params, multiply_on_every_replica)


def run_replica_dataset(ctx, params: dict) -> dict:
    """replica-dataset: each step's per-replica slices of range(n) on their devices, through ``fn`` on each."""
    import numpy as np

    replicas = MeshReplicas(ctx.runtime.strategy)
    per_replica = params["per_replica"]
    step_fn = replicas.map(replica_function(params["fn"]), in_specs=replicas.split, out_specs=replicas.split)

    def steps():
        for step_inputs in replica_dataset_plan(params["n"], per_replica, replicas.count):
            # Every device holds per_replica elements; a replica short of them (the last batch) ignores the rest.
            padded = [np.array(values + [0] * (per_replica - len(values)), dtype=np.int32) for values in step_inputs]
            inputs = replicas.from_blocks(padded)
            outputs = step_fn(inputs)
            sizes = [len(values) for values in step_inputs]
            yield (
                [block[:size] for block, size in zip(replicas.per_replica(inputs), sizes)],
                [block[:size] for block, size in zip(replicas.per_replica(outputs), sizes)],
            )

    return check_replica_dataset(ctx, params, replicas.count, steps())


def _all_reduce_checks(replicas: MeshReplicas) -> AllReduceChecks:
    """replica_id + 1 on each device, its ``lax.psum`` and ``lax.pmean`` there, and ``jnp.sum``/``jnp.mean`` outside."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def contribute():
        contribution = (jax.lax.axis_index(replicas.axis) + 1).astype(jnp.float32)
        return (
            contribution[None],
            jax.lax.psum(contribution, replicas.axis)[None],
            jax.lax.pmean(contribution, replicas.axis)[None],
        )

    contributions, sums, means = replicas.map(contribute, in_specs=(), out_specs=(replicas.split,) * 3)()
    return AllReduceChecks(
        contributions=[float(value) for value in np.asarray(contributions)],
        replica_sum=[float(value) for value in np.asarray(sums)],
        replica_mean=[float(value) for value in np.asarray(means)],
        # The sharded array reduced as a whole: XLA inserts the all-reduce across the devices.
        overall_sum=float(jax.jit(jnp.sum)(contributions)),
        overall_mean=float(jax.jit(jnp.mean)(contributions)),
        replica_how="lax.psum/pmean in shard_map",
        overall_how="jnp.sum/mean of the sharded array",
    )


def _timed_all_reduce(replicas: MeshReplicas, elements: int) -> TimedAllReduce:
    import jax
    import numpy as np

    # Every device holds a float32 buffer filled with its replica_id + 1.
    buffers = replicas.from_blocks([np.full(elements, index + 1, dtype=np.float32) for index in range(replicas.count)])
    all_reduce_step = replicas.map(
        lambda value: jax.lax.psum(value, replicas.axis), in_specs=replicas.split, out_specs=replicas.split
    )

    def reduce_and_wait():
        return all_reduce_step(buffers).block_until_ready()

    return TimedAllReduce(reduce_and_wait, replicas.per_replica)


def run_all_reduce(ctx, params: dict) -> dict:
    """all-reduce: the closed-form checks, then the timed ``psum`` and its bandwidth."""
    replicas = MeshReplicas(ctx.runtime.strategy)
    return check_all_reduce(
        ctx,
        params,
        replicas.count,
        lambda: _all_reduce_checks(replicas),
        lambda elements: _timed_all_reduce(replicas, elements),
    )
