"""Who does what when one run is N processes (one per host or per accelerator) sharing one run folder.

Every process runs the same program on the same flags and takes part in every collective:
the train and eval steps, Orbax's checkpoint saves and restores, and the few decisions below.
Process 0, the lead, alone touches the run folder's own files: its lock, an overwrite,
config.json, metrics.jsonl, TensorBoard events, checkpoint digests, plots and summary.json.
A decision taken from files (which checkpoint to resume, whether the folder could be claimed)
is the lead's, sent to every process, so no process waits at a collective another has left:
`lead_decides` runs a function on the lead and returns its result, or raises its error, in all.

With one process every helper here is the plain call, so a single-process run is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def multi() -> bool:
    """True when this run spans more than one process."""
    return jax.process_count() > 1


def is_lead() -> bool:
    """True in process 0: the one that writes the run folder's files."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process has come here (a no-op with one process)."""
    if multi():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _broadcast_json(obj: Any) -> Any:
    """Process 0's JSON-able `obj`, in every process (the others pass anything)."""
    from jax.experimental import multihost_utils

    data = json.dumps(obj).encode() if is_lead() else b""
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data))))
    raw = np.frombuffer(data, np.uint8) if is_lead() else np.zeros(size, np.uint8)
    raw = multihost_utils.broadcast_one_to_all(raw)
    return json.loads(np.asarray(raw, np.uint8).tobytes().decode())


def lead_decides(fn: Callable[[], Any], errors: tuple[type[Exception], ...] = ()) -> Any:
    """`fn()` run by the lead alone; its JSON-able result returned in every process.

    An exception in the lead is raised there as it is and, in the others, as the class of
    `errors` with its name (else RuntimeError) and the lead's message, so every process stops
    at the same point instead of one waiting forever for the rest.
    """
    if not multi():
        return fn()
    failure = None
    payload = None
    if is_lead():
        try:
            payload = {"value": fn()}
        except Exception as err:  # noqa: BLE001 - any error: re-raised in every process below
            failure = err
            payload = {"error": type(err).__name__, "message": str(err)}
    payload = _broadcast_json(payload)
    if "error" not in payload:
        return payload["value"]
    if failure is not None:
        raise failure
    cls = {c.__name__: c for c in errors}.get(payload["error"], RuntimeError)
    raise cls(f"(process 0) {payload['message']}")


def addressable(tree: Any) -> Any:
    """`tree` with every leaf readable by this process: an array spread over other processes'
    devices is gathered (a collective: every process must call this) onto this one's default device.

    What runs after training in one process's view (test NLL image by image, sampling) then runs on
    each process's own device, the same in all, with no collective inside.
    """
    if not multi():
        return tree
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        return jnp.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)
