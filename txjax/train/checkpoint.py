"""Orbax checkpoints of a training run: arrays (params, optimizer, step) plus JSON metadata.

The metadata holds the data position, the model and training configs and the tokenizer,
so a run can be resumed, and a checkpoint from a different config is refused with the
fields that differ instead of failing deep inside a shape check. Saves are synchronous:
the next train step donates the very buffers being written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run with a different configuration."""


class Checkpointer:
    """Numbered checkpoints under `directory` (`<step>/state`, `<step>/meta`); keeps the newest `keep`."""

    def __init__(self, directory: str | Path, keep: int = 2, *, read_only: bool = False):
        self.directory = Path(directory).absolute()
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"no checkpoint folder at {self.directory}")
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None if read_only else keep, create=not read_only, read_only=read_only,
                enable_async_checkpointing=False,
            ),
            item_names=("state", "meta"),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Write `state` (a pytree of arrays) and `meta` (JSON-able) as checkpoint `step`."""
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        self.manager.wait_until_finished()

    def read_meta(self, step: int | None = None) -> dict:
        """The JSON metadata of checkpoint `step` (default: the latest)."""
        step = self._step(step)
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict]:
        """(state, meta) of checkpoint `step`; `like` gives the tree structure, shapes and dtypes."""
        step = self._step(step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        return out["state"], out["meta"]

    def restore_params(self, like: Any, step: int | None = None) -> Any:
        """Only the parameters of checkpoint `step` (its state is a TrainState: params, opt_state,
        step); `like` gives their tree, shapes, dtypes and shardings. The optimizer moments are not read."""
        step = self._step(step)
        target = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, like)}
        restore = ocp.args.PyTreeRestore(target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                         partial_restore=True)
        return self.manager.restore(step, args=ocp.args.Composite(state=restore))["state"]["params"]

    def _step(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; have {self.all_steps()}")
        return step

    def close(self) -> None:
        self.manager.close()


def config_differences(saved: dict, current: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """'field: saved -> current' for every field that differs (JSON round-trip aware)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in ignore:
            continue
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if isinstance(a, list):
            a = tuple(a)
        if isinstance(b, list):
            b = tuple(b)
        if a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def check_compatible(meta: dict, sections: dict[str, tuple[dict, tuple[str, ...]]], where: str) -> None:
    """Raise CheckpointMismatch if any section of `meta` differs from the current config.

    sections: name -> (current config dict, fields allowed to differ).
    """
    problems = []
    for name, (current, ignore) in sections.items():
        saved = meta.get(name)
        if saved is None:
            problems.append(f"{name}: missing from the checkpoint")
            continue
        problems += [f"{name}.{d}" for d in config_differences(saved, current, ignore)]
    if problems:
        raise CheckpointMismatch(
            f"checkpoint in {where} was written with a different configuration:\n  "
            + "\n  ".join(problems)
            + "\nresume with the same flags, or pass a new --name (or --overwrite true) to start over"
        )
