"""TensorBoard events in a run folder: the same numbers as metrics.jsonl, the plots as images, a flag to turn off.

The events are read back with TensorBoard's own reader (event_accumulator), which needs no TensorFlow.
"""

import numpy as np
import pytest

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from test_train import random_rows, shift, tiny_model  # noqa: E402
from txjax.data import BatchIterator  # noqa: E402
from txjax.train.config import TrainConfig  # noqa: E402
from txjax.train.loop import fit, read_metrics, write_json  # noqa: E402
from txjax.train.plots import plot_loss_curve, save_image_grid  # noqa: E402
from txjax.train.rundir import prepare_run_dir  # noqa: E402
from txjax.train.steps import Stepper, gpt_loss  # noqa: E402

CFG = TrainConfig(batch_size=8, steps=4, warmup_steps=1, eval_every=2, learning_rate=1e-2, progress=False,
                  log_every=1)
HELD = shift(random_rows(8, seed=1))


def segment(stepper, folder, state=None, start=0, stop_at=None):
    """fit from `start` in a run folder, as train_run does (config.json first), without checkpoints."""
    write_json(prepare_run_dir(folder) / "config.json", {"train": stepper.cfg.to_dict()})
    batches = BatchIterator(random_rows(48), CFG.batch_size, seed=CFG.seed, transform=shift)
    state = stepper.init_state() if state is None else state
    return fit(stepper, state, batches, run_dir=folder, start_step=start, stop_at=stop_at,
               eval_fn=lambda params: stepper.evaluate(params, [HELD]), log=lambda *_: None)


def events(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def test_scalars_equal_metrics_jsonl_across_a_resume_and_plots_become_images(tmp_path):
    stepper = Stepper(tiny_model(), gpt_loss, CFG)
    state, _ = segment(stepper, tmp_path, stop_at=3)  # steps 1-3 logged; a resume from 2 logs 3 again
    segment(stepper, tmp_path, state, start=2)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    acc = events(tmp_path)
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/accuracy", "train/grad_norm", "train/lr", "train/tokens_per_s",
            "eval/loss", "eval/accuracy"} <= tags
    for split in ("train", "eval"):
        for name in ("loss", "accuracy"):
            want = [(r["step"], r[name]) for r in rows if r["split"] == split]
            got = [(e.step, e.value) for e in acc.Scalars(f"{split}/{name}")]
            assert [s for s, _ in got] == [s for s, _ in want], (split, name)  # resumed steps purged
            np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]

    plot_loss_curve(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    save_image_grid(np.random.default_rng(0).random((4, 6, 6)), tmp_path / "samples.png")
    acc = events(tmp_path)
    assert set(acc.Tags()["images"]) == {"loss", "samples"}
    assert [e.step for e in acc.Images("loss")] == [4]
    assert acc.Images("samples")[0].encoded_image_string.startswith(b"\x89PNG")


def test_the_flag_turns_the_events_off(tmp_path):
    segment(Stepper(tiny_model(), gpt_loss, CFG.replace(steps=1, tensorboard=False)), tmp_path)
    plot_loss_curve(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    assert not list(tmp_path.glob("events.out.tfevents.*"))
    assert (tmp_path / "loss.png").is_file() and read_metrics(tmp_path / "metrics.jsonl")
