"""Plots written beside a run: the loss curve and image grids (matplotlib, Agg backend).

A plot saved into a run folder whose run writes TensorBoard events is added to them as an
image too (tag: the file's stem; step: the run's last logged step).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from txjax.train.loop import read_metrics
from txjax.train.tensorboard import log_figure, writes_tensorboard


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_path: str | os.PathLike) -> Path:
    """Write the PNG, and the same figure into the run's TensorBoard events where it writes them."""
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    if writes_tensorboard(out_path.parent):
        rows = read_metrics(out_path.parent / "metrics.jsonl")
        log_figure(out_path.parent, out_path.stem, fig, max((r.get("step", 0) for r in rows), default=0))
    return out_path


def plot_loss_curve(metrics_path: str | os.PathLike, out_path: str | os.PathLike,
                    ylabel: str = "loss (nats / token)") -> Path:
    """Train loss per logged step, and held-out loss where evaluated, against the step."""
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r.get("split") == "train"]
    evals = [(r["step"], r["loss"]) for r in rows if r.get("split") == "eval" and "loss" in r]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train), label="train")
    if evals:
        ax.plot(*zip(*evals), "o-", label="held out")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out_path = _save(fig, out_path)
    plt.close(fig)
    return out_path


def image_grid(images_BHW: np.ndarray, pad: int = 2) -> np.ndarray:
    """Tile B images into a near-square grid with `pad` pixels of separation (value 0.5)."""
    images_BHW = np.asarray(images_BHW, dtype=np.float32)
    b, h, w = images_BHW.shape
    cols = math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad), 0.5, np.float32)
    for i, img in enumerate(images_BHW):
        r, c = divmod(i, cols)
        grid[pad + r * (h + pad): pad + r * (h + pad) + h, pad + c * (w + pad): pad + c * (w + pad) + w] = img
    return grid


def save_image_grid(images_BHW: np.ndarray, out_path: str | os.PathLike, title: str | None = None) -> Path:
    """Images with values in [0, 1] (white = 1) as one PNG grid."""
    plt = _pyplot()
    grid = image_grid(images_BHW)
    fig, ax = plt.subplots(figsize=(6, 6 * grid.shape[0] / grid.shape[1] + (0.4 if title else 0)))
    ax.imshow(grid, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out_path = _save(fig, out_path)
    plt.close(fig)
    return out_path
