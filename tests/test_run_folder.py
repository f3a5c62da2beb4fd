"""Damaged checkpoints and shared run folders: never a silent resume from bad bytes, never two runs in one folder."""

import json

import jax
import numpy as np
import pytest

from test_train import random_rows, shift, tiny_model
from txjax.data import BatchIterator
from txjax.train.checkpoint import CheckpointDamaged, Checkpointer, CheckpointMismatch, CheckpointWriteError
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.rundir import RunDirError, claim_run_dir
from txjax.train.steps import gpt_loss

CFG = TrainConfig(batch_size=8, steps=6, warmup_steps=1, checkpoint_every=2, keep_checkpoints=3,
                  learning_rate=1e-2, progress=False, log_every=1)


def run(tmp_path, name="r", cfg=CFG, stop_at=None, log=None):
    batches = BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift)
    return train_run(tiny_model(), gpt_loss, cfg, RunConfig(name=name, runs_dir=str(tmp_path)), batches,
                     stop_at=stop_at, log=(lambda *_: None) if log is None else log)


def flip_a_byte(step_dir):
    """One bit pattern changed in the middle of the step's largest array file."""
    path = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in p.as_posix()),
               key=lambda p: p.stat().st_size)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path):
    """Bytes flipped in step 4: the resume says so, starts from step 2, sets step 4 aside, and ends
    exactly where an uninterrupted run ends."""
    _, straight, _ = run(tmp_path, "straight")
    run(tmp_path, stop_at=4)
    flip_a_byte(tmp_path / "r" / "checkpoints" / "4")
    lines = []
    _, resumed, summary = run(tmp_path, log=lines.append)
    assert summary["resumed_from"] == 2
    assert any("damaged checkpoint" in line and "step 4 (state/" in line and "using step 2" in line
               for line in lines)
    assert (tmp_path / "r" / "checkpoints" / "damaged-4").is_dir()
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_intact_checkpoint_is_a_clear_error_naming_the_folder(tmp_path):
    run(tmp_path, cfg=CFG.replace(checkpoint_every=4), stop_at=4)
    folder = tmp_path / "r" / "checkpoints"
    flip_a_byte(folder / "4")
    with pytest.raises(CheckpointDamaged, match=f"every checkpoint in {folder} is damaged: 4 \\(state/"):
        run(tmp_path)
    reader = Checkpointer(folder, read_only=True)
    with pytest.raises(CheckpointDamaged, match="checkpoint 4 in .* is damaged"):
        reader.read_meta(4)
    reader.close()


def test_a_refused_resume_leaves_config_json_alone(tmp_path):
    run(tmp_path, cfg=CFG.replace(steps=2))
    before = (tmp_path / "r" / "config.json").read_text()
    with pytest.raises(CheckpointMismatch, match="train.batch_size: 8 -> 4"):
        run(tmp_path, cfg=CFG.replace(steps=2, batch_size=4))
    assert (tmp_path / "r" / "config.json").read_text() == before
    assert json.loads(before)["train"]["batch_size"] == 8


def test_a_second_run_in_a_held_folder_is_refused_and_metrics_stay_one_runs(tmp_path):
    with claim_run_dir(tmp_path / "r"):
        with pytest.raises(RunDirError, match=r"in use by another run \(pid \d+\)"):
            run(tmp_path)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
    run(tmp_path, cfg=CFG.replace(steps=2))  # released: the folder is free again
    assert (tmp_path / "r" / "metrics.jsonl").exists()


def test_overwrite_empties_the_folder_only_once_it_is_claimed(tmp_path):
    old = tmp_path / "r"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    with claim_run_dir(old, overwrite=True) as path:
        assert sorted(p.name for p in path.iterdir()) == [".lock"]


def test_overwrite_with_a_missing_data_file_keeps_the_old_run(tmp_path, capsys):
    """--overwrite true empties the folder only after the inputs have loaded."""
    from experiment_scripts import load_script

    old = tmp_path / "g"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(SystemExit):
        load_script("train_gpt").main(["--preset", "cpu", "--runs_dir", str(tmp_path), "--name", "g",
                                       "--overwrite", "true", "--data", str(tmp_path / "missing.npz")])
    assert "missing.npz" in capsys.readouterr().err
    assert (old / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_stray_empty_step_and_garbled_metadata_are_named_not_tracebacks(tmp_path):
    """An empty `checkpoints/8` is passed over as incomplete; garbled JSON metadata fails its digest."""
    from txjax.train.steps import Stepper

    state = Stepper(tiny_model(), gpt_loss, CFG).init_state()
    writer = Checkpointer(tmp_path / "ck", log=lambda *_: None)
    writer.save(2, state, {"note": "x"})
    writer.close()
    (tmp_path / "ck" / "8").mkdir()
    lines = []
    reader = Checkpointer(tmp_path / "ck", read_only=True, log=lines.append)
    assert reader.read_meta() == {"note": "x"}
    assert "step 8 (incomplete: no state or meta written); using step 2" in lines[0]
    reader.close()
    (tmp_path / "ck" / "2" / "meta" / "metadata").write_text("{garbled")
    reader = Checkpointer(tmp_path / "ck", read_only=True)
    with pytest.raises(CheckpointDamaged, match="2 \\(meta/metadata differs from what was saved\\)"):
        reader.read_meta()
    reader.close()


@pytest.mark.parametrize("error", [
    ValueError("RESOURCE_EXHAUSTED: Error writing \"x\" in OCDBT database: Failed to write 623179 bytes to "
               "file 22: No space left on device [os_error_code='28']"),  # what Orbax raises on a full disk
    OSError(28, "No space left on device"),
])
def test_a_full_disk_is_one_line_naming_the_folder_and_the_step_to_resume(tmp_path, error, caplog):
    from txjax.train.steps import Stepper

    state = Stepper(tiny_model(), gpt_loss, CFG).init_state()
    writer = Checkpointer(tmp_path / "ck", log=lambda *_: None)
    writer.save(2, state, {"note": "x"})
    real_save = writer.manager.save

    def failing_save(*args, **kwargs):
        import logging

        logging.getLogger("absl").error("a long traceback from Orbax's thread")
        raise error

    writer.manager.save = failing_save
    with pytest.raises(CheckpointWriteError) as info:
        writer.save(4, state, {"note": "x"})
    assert str(info.value) == (f"could not write checkpoint 4 in {tmp_path / 'ck'}: no space left on the device; "
                               "after fixing it, the same command resumes from step 2")
    assert "traceback from Orbax" not in caplog.text
    writer.manager.save = real_save
    assert writer.newest_intact() == 2
    writer.close()
