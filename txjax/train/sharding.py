"""Where training arrays live on a device mesh: data parallel (DP) and fully sharded (FSDP).

One mesh axis, "data", spans every device (of every process). The batch is split
along it in both modes. DP keeps a full copy of the parameters and optimizer state
on each device; XLA all-reduces the gradients. FSDP (ZeRO-3) splits every parameter
and its Adam moments along one dimension over the same axis, gathers the full
parameters inside the step for the forward and backward pass, and reduce-scatters
the gradients back to the shards. Both are written as `jax.jit` with input and output
shardings (GSPMD): the step function is the same one the single device runs.

Multi-host: call `initialize_distributed` first thing in every process; the mesh
then spans all processes' devices and each process feeds only its own rows of the
(identical, deterministic) global batch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from txjax.train.config import PARALLELISMS  # defined once, beside TrainConfig.parallelism

AXIS = "data"
SHARDED = tuple(p for p in PARALLELISMS if p != "none")
"""The parallelisms that lay state and batches out over a mesh (a Layout's modes)."""


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """`jax.distributed.initialize` from arguments or $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES,
    $JAX_PROCESS_ID; with none of them but $TXJAX_DISTRIBUTED=auto, with no arguments (JAX detects
    SLURM, Open MPI and TPU pods itself). True if it initialized; False, doing nothing, when none
    of these is given or JAX's distributed system is already up.

    Call it before anything touches a JAX device. On CPU the processes talk through
    gloo over TCP (jax's default `jax_cpu_collectives_implementation`). Auto-detection only
    on request: a laptop or CI job that happens to run under SLURM stays one process.
    """
    if jax.distributed.is_initialized():
        return False
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    auto = os.environ.get("TXJAX_DISTRIBUTED", "").strip().lower()
    if auto not in ("", "auto"):
        raise ValueError(f"TXJAX_DISTRIBUTED={auto!r}: expected auto or nothing")
    if coordinator_address is None and num_processes is None and process_id is None:
        if auto != "auto":
            return False
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize()
        return True
    if None in (coordinator_address, num_processes, process_id):
        raise ValueError(
            "multi-host needs all three of coordinator address, process count and process id; got "
            f"{coordinator_address!r}, {num_processes!r}, {process_id!r}"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return True


def process_shard() -> tuple[int, int]:
    """(this process's index, process count): the `shard` of a `BatchIterator` in a multi-host run."""
    return jax.process_index(), jax.process_count()


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh named "data" over `devices` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (AXIS,))


def fsdp_spec(shape: tuple[int, ...], num_shards: int) -> P:
    """Shard the largest dimension divisible by `num_shards` (the first on ties); else replicate.

    Why the largest: it leaves each device the smallest slice; a kernel [D, F] splits F.
    """
    best = None
    for i, size in enumerate(shape):
        if size % num_shards == 0 and size >= num_shards and (best is None or size > shape[best]):
            best = i
    if best is None:
        return P()
    return P(*(AXIS if i == best else None for i in range(len(shape))))


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and a mode ("dp" | "fsdp"): the shardings of state and batches, and the jitted steps."""

    mesh: Mesh
    mode: str

    def __post_init__(self):
        if self.mode not in SHARDED:
            raise ValueError(f"sharding mode {self.mode!r} is not {' or '.join(map(repr, SHARDED))}")
        if self.mesh.axis_names != (AXIS,):
            raise ValueError(f"the mesh must have one axis named {AXIS!r}, got {self.mesh.axis_names}")

    @property
    def size(self) -> int:
        """Devices on the data axis."""
        return self.mesh.shape[AXIS]

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def batch(self) -> NamedSharding:
        """Examples (dimension 0) split over the data axis."""
        return NamedSharding(self.mesh, P(AXIS))

    def array_sharding(self, x) -> NamedSharding:
        """Replicated under DP; under FSDP, split along `fsdp_spec` (scalars stay replicated)."""
        if self.mode == "dp":
            return self.replicated
        return NamedSharding(self.mesh, fsdp_spec(tuple(np.shape(x)), self.size))

    def shardings(self, tree) -> Any:
        """A NamedSharding per leaf of `tree` (params, optimizer state or a whole TrainState)."""
        return jax.tree.map(self.array_sharding, tree)

    def put(self, tree, shardings=None) -> Any:
        """Place host or single-device arrays, identical in every process, on the mesh.

        Each process copies only the slices its own devices hold, so this also works when
        the mesh spans several processes.
        """
        shardings = self.shardings(tree) if shardings is None else shardings

        def place(x, sharding):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

        return jax.tree.map(place, tree, shardings)

    def put_batch(self, batch, global_rows: int | None = None) -> Any:
        """A batch split by examples over the mesh: the global batch (the same rows in every
        process), or, in a multi-process run, this process's rows of it when it has
        `global_rows / process_count` of them (what `BatchIterator(shard=process_shard())` yields:
        process p holds rows [p * b, (p + 1) * b), which its devices own on the mesh)."""
        processes = jax.process_count()

        def place(x):
            x = np.asarray(x)
            if processes > 1 and global_rows is not None and x.ndim and x.shape[0] * processes == global_rows:
                self._check_row_blocks(global_rows)
                return jax.make_array_from_process_local_data(self.batch, x, (global_rows, *x.shape[1:]))
            if x.ndim == 0 or x.shape[0] % self.size:
                raise ValueError(
                    f"a batch of {x.shape[0] if x.ndim else 0} examples cannot be split over "
                    f"{self.size} devices; make batch_size / grad_accum a multiple of {self.size}"
                )
            return jax.make_array_from_callback(x.shape, self.batch, lambda index: x[index])

        return jax.tree.map(place, batch)

    def _check_row_blocks(self, global_rows: int) -> None:
        """This process's devices own rows [p * b, (p + 1) * b) of a global batch, b = rows / processes."""
        b, p = global_rows // jax.process_count(), jax.process_index()
        owned = {i[0].indices(global_rows)[:2] for i in
                 self.batch.addressable_devices_indices_map((global_rows,)).values()}
        if min(start for start, _ in owned) != p * b or max(stop for _, stop in owned) != (p + 1) * b:
            raise ValueError(f"process {p}'s devices hold rows {sorted(owned)} of the global batch, not the "
                             f"block [{p * b}, {(p + 1) * b}) its shard of the data holds; build the mesh "
                             "from jax.devices() in process order")

    def put_key(self, key: jax.Array) -> jax.Array:
        """A PRNG key replicated on the mesh (through its raw uint32 data)."""
        data = self.put(jax.random.key_data(key), self.replicated)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))

    def gather(self, params):
        """Inside jit: the full parameters on every device (FSDP's all-gather before compute)."""
        if self.mode == "dp":
            return params
        return jax.lax.with_sharding_constraint(params, jax.tree.map(lambda _: self.replicated, params))

    def split_micro(self, micro):
        """Inside jit: micro-batches [A, B/A, ...] keep their examples split over the data axis."""
        return jax.lax.with_sharding_constraint(micro, NamedSharding(self.mesh, P(None, AXIS)))

    def jit_train_step(self, step: Callable, state_like, global_rows: int | None = None) -> Callable:
        """`step(state, batch, key) -> (state, metrics)` jitted with the state donated and kept in
        its shardings; the returned function places a host batch (global, or this process's
        rows of `global_rows`: see `put_batch`) and key on the mesh first."""
        state_sh = self.shardings(state_like)
        jitted = jax.jit(step, in_shardings=(state_sh, self.batch, self.replicated),
                         out_shardings=(state_sh, self.replicated), donate_argnums=(0,))

        def train_step(state, batch, key):
            return jitted(state, self.put_batch(batch, global_rows), self.put_key(key))

        train_step.jitted = jitted
        return train_step

    def jit_eval_step(self, step: Callable, params_like) -> Callable:
        """`step(params, batch) -> sums` jitted over sharded params and batch, replicated sums."""
        jitted = jax.jit(step, in_shardings=(self.shardings(params_like), self.batch),
                         out_shardings=self.replicated)

        def eval_step(params, batch):
            return jitted(params, self.put_batch(batch))

        eval_step.jitted = jitted
        return eval_step


def describe(tree) -> dict[str, str]:
    """'path' -> its sharding spec and per-device shard shape, for logs and tests."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        sharding = getattr(x, "sharding", None)
        spec = getattr(sharding, "spec", None)
        shard = sharding.shard_shape(x.shape) if sharding is not None else np.shape(x)
        out[jax.tree_util.keystr(path)] = f"{spec} {tuple(shard)}"
    return out
