"""TensorBoard event files in a run folder, beside metrics.jsonl, written by tensorboardX (no TensorFlow).

`fit` hands every metrics.jsonl row to `log_row`, so the events hold the same numbers as the
file, as `train/<name>` and `eval/<name>` (loss, accuracy, grad_norm, lr, tokens_per_s, ...).
A figure that `txjax.train.plots` saves into a run folder afterwards (loss.png, samples.png)
is added as an image by `log_figure`. Nothing is written where tensorboardX is not installed
or `TrainConfig.tensorboard` is off. View with `tensorboard --logdir runs`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def open_writer(run_dir: str | os.PathLike, enabled: bool = True, purge_step: int | None = None):
    """A tensorboardX SummaryWriter on `run_dir`, or None (disabled, or tensorboardX not installed).

    purge_step: a resumed run's first step; TensorBoard drops what an earlier process logged from
    there on, as `fit` drops those metrics.jsonl rows.
    """
    if not enabled:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    # Its own file, named to sort after every earlier one: tensorboardX names files by the second
    # (a second writer that second would overwrite the first), and TensorBoard reads a folder's
    # files in name order, so a file sorted before an older one would have its events purged by
    # that one's resume marker.
    return SummaryWriter(logdir=str(run_dir), purge_step=purge_step, flush_secs=10,
                         filename_suffix=f".{time.time_ns()}.{os.getpid()}")


def log_row(writer, row: dict) -> None:
    """One metrics.jsonl row as scalars `<split>/<name>` at its step; None (non-finite) and text skipped."""
    if writer is None:
        return
    split = row.get("split", "train")
    for name, value in row.items():
        if name in ("step", "split") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        writer.add_scalar(f"{split}/{name}", value, row["step"])


def writes_tensorboard(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` is a run folder whose run writes TensorBoard events (its config.json says so)."""
    try:
        train = json.loads((Path(run_dir) / "config.json").read_text()).get("train", {})
    except (OSError, ValueError, AttributeError):
        return False
    return bool(isinstance(train, dict) and train.get("tensorboard", False))


def log_figure(run_dir: str | os.PathLike, tag: str, figure, step: int) -> None:
    """A matplotlib figure as the image `tag` at `step` in the run's events (the figure stays open)."""
    writer = open_writer(run_dir, writes_tensorboard(run_dir))
    if writer is None:
        return
    try:
        writer.add_figure(tag, figure, step, close=False)
    finally:
        writer.close()
