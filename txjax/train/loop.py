"""The training loop: steps, metrics one step late, progress bar, checkpoints, NaN stop.

Metrics of step k are fetched after step k+1 has been dispatched (nanodo's trick), so the
host never makes the device wait; only at a checkpoint is the current step's metrics
fetched at once, because a checkpoint is written only when its loss is known to be finite.

In a run of several processes all of them step, evaluate and checkpoint; process 0 alone
writes metrics.jsonl and TensorBoard events and shows the progress bar (txjax.train.multihost).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from txjax.train.checkpoint import Checkpointer, check_compatible
from txjax.train.rundir import RunDirError, prepare_run_dir  # noqa: F401 - re-exported: scripts check the folder early
from txjax.train.config import TrainConfig
from txjax.train.multihost import is_lead
from txjax.train.steps import Stepper, TrainState
from txjax.train.tensorboard import log_row, open_writer


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm became NaN or Inf; the run stopped."""


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (a temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics.jsonl file (empty if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_metrics(path: Path, last_step: int) -> None:
    """Drop rows after `last_step`: a resumed run recomputes them."""
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@jax.jit
def _leaves_finite(leaves: list) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def all_finite(tree: Any) -> bool:
    """True if every floating-point leaf of `tree` is finite: one jitted program for the tree.

    Not two eager ops per leaf: on a sharded tree each is a multi-device program, and
    XLA:CPU deadlocks with more than ~32 of them in flight (measured with 8 host devices).
    """
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    return bool(_leaves_finite(leaves)) if leaves else True


def restore_or_init(stepper: Stepper, checkpointer: Checkpointer, batches, meta: dict,
                    ignore: dict[str, tuple[str, ...]] | None = None) -> tuple[TrainState, int]:
    """The latest checkpoint's state (data position restored into `batches`), or a fresh state.

    meta: the current run's config sections (e.g. {"model": ..., "train": ...}); each must
    equal the checkpoint's, except the fields named in `ignore[section]`.
    """
    state = stepper.init_state()
    step = checkpointer.newest_intact()
    if step is None:
        return state, 0
    saved = checkpointer.read_meta(step)
    ignore = ignore or {}
    check_compatible(saved, {k: (v, ignore.get(k, ())) for k, v in meta.items()},
                     str(checkpointer.directory))
    state, saved = checkpointer.restore(state, step)
    batches.set_state(saved["data"])
    return state, int(step)


def fit(
    stepper: Stepper,
    state: TrainState,
    batches: Iterator,
    *,
    run_dir: str | os.PathLike | None = None,
    checkpointer: Checkpointer | None = None,
    meta: dict | None = None,
    start_step: int = 0,
    eval_fn: Callable[[Any], dict] | None = None,
    stop_at: int | None = None,
    key: jax.Array | None = None,
    log: Callable[[str], None] = print,
) -> tuple[TrainState, dict]:
    """Train from `start_step` to `cfg.steps` (or `stop_at`, as if killed there).

    batches: an iterator of batches with `.state` (a position with `to_dict()`) and
      `set_state`, such as `txjax.data.BatchIterator`.
    meta: JSON-able config sections saved in every checkpoint beside the data position.
    eval_fn(params) -> {name: value}: held-out metrics, every `eval_every` steps and at the end,
      of `stepper.eval_params(state)` (the moving average with `cfg.ema_decay`).
    Appends rows to run_dir/metrics.jsonl, and the same numbers to TensorBoard events there
    (`cfg.tensorboard`, with tensorboardX installed); returns (state, summary). Raises NonFiniteLoss
    (after writing what it knows) when the loss or gradient norm is NaN or Inf; the last
    checkpoint on disk is then the last good one. On Ctrl-C (KeyboardInterrupt) it first
    checkpoints the last finished step, so a rerun resumes there, then re-raises.

    Without a run folder (the studies): run_dir=None writes no metrics.jsonl and
    checkpointer=None writes no checkpoints and reads no data position, so `batches` may
    be any iterator of batches. key: the training key (dropout); default
    fold_in(key(cfg.seed), 1).
    """
    cfg: TrainConfig = stepper.cfg
    meta = meta or {}
    rows_file = None
    if not is_lead():
        run_dir = None  # process 0 writes the run folder's files
    if run_dir is not None:
        metrics_path = Path(run_dir) / "metrics.jsonl"
        _truncate_metrics(metrics_path, start_step)
    end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    if key is None:
        key = jax.random.fold_in(jax.random.key(cfg.seed), 1)
    bar = tqdm(total=cfg.steps, initial=start_step, disable=not (cfg.progress and is_lead()), dynamic_ncols=True,
               mininterval=1.0, unit="step", desc="train")
    clock = {"t0": time.perf_counter(), "first_done": None, "first_step": None,
             "tokens_after_first": 0.0, "window": None}
    last: dict = {}
    events = None
    if run_dir is not None:
        rows_file = open(metrics_path, "a")
        events = open_writer(run_dir, cfg.tensorboard, purge_step=start_step + 1 if start_step else None)

    def write_row(row: dict) -> None:
        if rows_file is None:
            return
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        rows_file.write(json.dumps(row) + "\n")
        rows_file.flush()
        log_row(events, row)

    def handle(step_no: int, metrics) -> None:
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        now = time.perf_counter()
        if clock["first_done"] is None:  # the first step of this process includes compilation
            clock["first_done"], clock["first_step"] = now, step_no
            clock["window"] = (now, step_no, 0.0)
        else:
            clock["tokens_after_first"] += m["tokens"]
            t_w, s_w, tok_w = clock["window"]
            tok_w += m["tokens"]
            clock["window"] = (t_w, s_w, tok_w)
            m["tokens_per_s"] = tok_w / (now - t_w)
            m["ms_per_step"] = 1000.0 * (now - t_w) / (step_no - s_w)
        row = {"step": step_no, "split": "train", "time_s": round(now - clock["t0"], 3), **m}
        if not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])):
            write_row(row)
            good = None if checkpointer is None else checkpointer.latest_step()
            raise NonFiniteLoss(
                f"step {step_no}: loss {m['loss']}, grad norm {m['grad_norm']} - stopping. "
                + (f"The last good checkpoint is step {good} in {checkpointer.directory}."
                   if good is not None else "No checkpoint was written before it.")
            )
        last.update(row)
        if step_no % cfg.log_every == 0 or step_no == end or step_no == start_step + 1:
            write_row(row)
            clock["window"] = (now, step_no, 0.0)  # throughput is averaged between logged rows
        bar.update(step_no - bar.n)
        if "tokens_per_s" in m:
            bar.set_postfix(loss=f"{m['loss']:.4f}", tok_s=f"{m['tokens_per_s']:.0f}", refresh=False)

    def save(step_no: int) -> None:
        state = current()
        if not all_finite(state.params):
            raise NonFiniteLoss(f"step {step_no}: parameters are not finite; checkpoint not written")
        checkpointer.save(step_no, state, {**meta, "step": step_no, "data": batches.state.to_dict()})

    def evaluate(step_no: int) -> dict:
        result = eval_fn(stepper.eval_params(current()))
        write_row({"step": step_no, "split": "eval", **result})
        line = f"step {step_no}: " + ", ".join(f"eval {k} {v:.4g}" for k, v in result.items()
                                               if isinstance(v, float))
        bar.write(line) if cfg.progress else log(line)
        return result

    def save_on_interrupt() -> None:
        """Ctrl-C: checkpoint the last finished step, with the data position it had then."""
        done_step, data = finished["step"], finished["data"]
        if checkpointer is None or done_step <= start_step or checkpointer.latest_step() == done_step:
            return
        try:
            if pending is not None:
                handle(*pending)
            state = current()
            if not all_finite(state.params):
                raise NonFiniteLoss("parameters are not finite")
            checkpointer.save(done_step, state, {**meta, "step": done_step, "data": data})
            log(f"interrupted: saved step {done_step} in {checkpointer.directory}")
        except Exception as e:  # e.g. buffers donated to a step that never ran
            log(f"interrupted at step {done_step}: no checkpoint written ({type(e).__name__}: {e})")

    # The state travels between steps as its leaves (see Stepper.step_leaves); `current()` rebuilds it.
    leaves = stepper.leaves(state)

    def current() -> TrainState:
        return jax.tree.unflatten(stepper.state_def, leaves)

    pending = None
    eval_result: dict = {}
    step_no = start_step
    finished = {"step": start_step, "data": None}  # the last step whose train_step returned
    try:
        for step_no in range(start_step + 1, end + 1):
            batch = next(batches)
            leaves, metrics = stepper.step_leaves(leaves, batch, key)
            finished.update(step=step_no, data=None if checkpointer is None else batches.state.to_dict())
            if pending is not None:
                handle(*pending)
            pending = (step_no, metrics)
            if checkpointer is not None and (step_no % cfg.checkpoint_every == 0 or step_no == cfg.steps):
                handle(*pending)
                pending = None
                save(step_no)
            if eval_fn is not None and cfg.eval_every and step_no % cfg.eval_every == 0 and step_no != cfg.steps:
                eval_result = evaluate(step_no)
        if pending is not None:
            handle(*pending)
            pending = None
        if eval_fn is not None and end == cfg.steps and end > start_step:
            eval_result = evaluate(end)
    except KeyboardInterrupt:
        save_on_interrupt()
        raise
    finally:
        bar.close()
        if rows_file is not None:
            rows_file.close()
        if events is not None:
            events.close()
    done = time.perf_counter()
    steady = None
    if clock["first_done"] is not None and step_no > clock["first_step"]:
        steady = (done - clock["first_done"]) / (step_no - clock["first_step"])
    summary = {
        "steps": step_no,
        "train_loss": last.get("loss"),
        "train_accuracy": last.get("accuracy"),
        "wall_s": done - clock["t0"],
        "ms_per_step": None if steady is None else 1000.0 * steady,
        "tokens_per_s": None if steady is None else clock["tokens_after_first"] / (done - clock["first_done"]),
        "eval": eval_result,
    }
    return current(), summary
