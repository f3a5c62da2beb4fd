"""Orbax checkpoints of a training run: arrays (params, optimizer, step) plus JSON metadata.

The metadata holds the data position, the model and training configs and the tokenizer,
so a run can be resumed, and a checkpoint from a different config is refused with the
fields that differ instead of failing deep inside a shape check. Saves are synchronous:
the next train step donates the very buffers being written.

Each saved step also gets `sha256.json`, the digest of every file Orbax wrote for it;
reading a checkpoint checks them first, and without an explicit step the newest intact
one is read, saying which damaged ones it passed over.

In a run of several processes every one of them takes part in Orbax's saves and restores
(each writes and reads the shards its devices hold); process 0 alone writes the digests,
checks them and moves damaged steps aside, and every process restores the step it chose
(`txjax.train.multihost.lead_decides`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from txjax.config import CONFIGS
from txjax.train.config import TrainConfig
from txjax.train.multihost import lead_decides, multi

DIGESTS = "sha256.json"


def _digests(step_dir: Path) -> dict[str, str]:
    """sha256 of every file under a step's folder (but the digest file), by relative path."""
    out = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGESTS):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[path.relative_to(step_dir).as_posix()] = h.hexdigest()
    return out


class CheckpointDamaged(ValueError):
    """No checkpoint in the folder (or not the one asked for) has the bytes it was saved with."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the older ones are untouched."""


@contextlib.contextmanager
def _absl_errors_silenced() -> Iterator[None]:
    """Orbax logs a failed write's traceback (hundreds of lines) from its thread before raising it;
    the caller reports the error itself, in one line."""
    def drop(record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR

    logger = logging.getLogger("absl")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run with a different configuration."""


class Checkpointer:
    """Numbered checkpoints under `directory` (`<step>/state`, `<step>/meta`); keeps the newest `keep`."""

    def __init__(self, directory: str | Path, keep: int = 2, *, read_only: bool = False,
                 log: Callable[[str], None] = print):
        self.directory = Path(directory).absolute()
        self.log = log
        self.read_only = read_only
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
        """Write `state` (a pytree of arrays) and `meta` (JSON-able) as checkpoint `step`.

        A write that fails (e.g. a full disk) is a CheckpointWriteError naming the folder; the
        step is left incomplete, so a resume starts from the newest complete one."""
        step_dir = self.directory / str(step)
        try:
            with _absl_errors_silenced():
                self.manager.save(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                    force=True,
                )
                self.manager.wait_until_finished()
            lead_decides(lambda: self._write_digests(step_dir), errors=(OSError, ValueError))
        except (OSError, ValueError) as err:
            full = getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err)
            why = "no space left on the device" if full else f"{type(err).__name__}: {str(err)[:300]}"
            latest = max((s for s in self.all_steps() if s != step), default=None)
            resume = (f"; after fixing it, the same command resumes from step {latest}" if latest is not None
                      else "; no earlier checkpoint exists")
            raise CheckpointWriteError(f"could not write checkpoint {step} in {self.directory}: {why}{resume}") from err

    @staticmethod
    def _write_digests(step_dir: Path) -> None:
        tmp = step_dir / f".{DIGESTS}.tmp"
        tmp.write_text(json.dumps(_digests(step_dir), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, step_dir / DIGESTS)

    def damage(self, step: int) -> str | None:
        """What is wrong with checkpoint `step`'s files, or None when they are as saved. A step
        without digests (saved by an older txjax, or killed between Orbax's save and them) passes."""
        step_dir = self.directory / str(step)
        try:
            saved = json.loads((step_dir / DIGESTS).read_text())
        except FileNotFoundError:
            missing = [item for item in ("state", "meta") if not (step_dir / item).is_dir()]
            return f"incomplete: no {' or '.join(missing)} written" if missing else None
        except (OSError, ValueError) as err:
            return f"unreadable {DIGESTS} ({err})"
        found = _digests(step_dir)
        for name in sorted(set(saved) | set(found)):
            if name not in found:
                return f"{name} is missing"
            if saved.get(name) != found[name]:
                return f"{name} differs from what was saved" if name in saved else f"{name} was not saved"
        return None

    def newest_intact(self) -> int | None:
        """The newest step whose files are as saved (None: no checkpoint at all). Damaged newer
        ones are reported through `log` and (unless read-only) moved aside to `damaged-<step>`,
        so training can write those steps again; every step damaged is a CheckpointDamaged.
        Several processes: process 0's answer, in all of them."""
        step = lead_decides(self._newest_intact_here, errors=(CheckpointDamaged,))
        if multi():
            self.manager.reload()  # process 0 may have moved damaged steps aside
        return step

    def _newest_intact_here(self) -> int | None:
        steps = sorted(self.all_steps(), reverse=True)
        damaged = []
        for step in steps:
            problem = self.damage(step)
            if problem is None:
                if damaged:
                    self._set_aside([int(d.split()[0]) for d in damaged])
                    self.log(f"damaged checkpoint in {self.directory}, passed over: step {'; step '.join(damaged)}; "
                             f"using step {step}" + ("" if self.read_only else " (the damaged ones moved to damaged-<step>)"))
                return step
            damaged.append(f"{step} ({problem})")
        if damaged:
            raise CheckpointDamaged(f"every checkpoint in {self.directory} is damaged: " + "; ".join(damaged)
                                    + "; remove the folder, or pass --overwrite true to start over")
        return None

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

    def _set_aside(self, steps: list[int]) -> None:
        if self.read_only:
            return
        for step in steps:
            os.replace(self.directory / str(step), self.directory / f"damaged-{step}")
        self.manager.reload()

    def _step(self, step: int | None) -> int:
        """The step to read: the newest intact one, or `step` if it is there and intact."""
        if step is None:
            step = self.newest_intact()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            return step
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; have {self.all_steps()}")
        problem = lead_decides(lambda: self.damage(step))
        if problem is not None:
            raise CheckpointDamaged(f"checkpoint {step} in {self.directory} is damaged: {problem}")
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


def with_field_defaults(saved: dict, cls=None) -> dict:
    """A model section (or, with cls, a section of that config class) written before a config
    field existed, that field read as its default (fields are added with the default that keeps
    what older runs computed, e.g. BertConfig.head, TrainConfig.ema_decay)."""
    cls = cls or CONFIGS.get(saved.get("family"))
    if cls is None:
        return saved
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    return {**defaults, **saved}


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
        if name in ("model", "train"):
            saved = with_field_defaults(saved, TrainConfig if name == "train" else None)
        problems += [f"{name}.{d}" for d in config_differences(saved, current, ignore)]
    if problems:
        raise CheckpointMismatch(
            f"checkpoint in {where} was written with a different configuration:\n  "
            + "\n  ".join(problems)
            + "\nresume with the same flags, or pass a new --name (or --overwrite true) to start over"
        )
