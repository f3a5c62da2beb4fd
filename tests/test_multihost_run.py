"""experiments/train_gpt.py as two processes on 127.0.0.1 (1 CPU device each, gloo) sharing one run
folder: killed after a checkpoint, started again, it resumes and ends with the parameters of one
process running the same command uninterrupted on 2 devices.

Dropout stays at the cpu preset's 0: the comparison is about the loop, the checkpoints and who
writes what, not about dropout masks under sharding.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from test_sharding import ROOT, TIMEOUT_S, free_port, wait, worker_env

from txjax import GPT
from txjax.config import config_from_dict
from txjax.tasks.sample import load_run

SCRIPT = ROOT / "experiments" / "train_gpt.py"
STEPS = 12


def tiny_mnist(path):
    """64 training and 16 test 'digits' (a bright rectangle somewhere), enough for a few steps."""
    rng = np.random.default_rng(0)

    def images(n):
        x = np.zeros((n, 28, 28), np.uint8)
        for i, (r, c) in enumerate(rng.integers(2, 18, (n, 2))):
            x[i, r: r + 8, c: c + 6] = 255
        return x

    np.savez(path, x_train=images(64), y_train=rng.integers(0, 10, 64).astype(np.uint8),
             x_test=images(16), y_test=rng.integers(0, 10, 16).astype(np.uint8))
    return path


def command(runs_dir, data) -> list[str]:
    # eps 1e-3: see tests/sharding_worker.py run_steps (updates Lipschitz in the gradient, so a
    # different all-reduce order cannot move a parameter with a ~0 gradient by a whole lr).
    return [sys.executable, str(SCRIPT), "--preset", "cpu", "--dtype", "float32", "--d_model", "32",
            "--num_heads", "2", "--num_layers", "1", "--d_ff", "64", "--steps", str(STEPS), "--batch_size", "8",
            "--warmup_steps", "2", "--eps", "1e-3", "--checkpoint_every", "4", "--log_every", "1",
            "--eval_batches", "1", "--parallelism", "fsdp", "--progress", "false", "--tensorboard", "false",
            "--data", str(data), "--test_images", "16", "--eval_batch_size", "8", "--num_samples", "1",
            "--quality_samples", "0", "--runs_dir", str(runs_dir), "--name", "g"]


def launch(runs_dir, data, processes: int, devices: int) -> list[subprocess.Popen]:
    """The command as `processes` processes of `devices` CPU devices each (one run)."""
    port = free_port()
    cache = {k: v for k, v in os.environ.items() if k.startswith("JAX_") and "CACHE" in k}  # conftest's
    procs = []
    for pid in range(processes):
        multi = {} if processes == 1 else {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                                           "JAX_NUM_PROCESSES": str(processes), "JAX_PROCESS_ID": str(pid)}
        procs.append(subprocess.Popen(command(runs_dir, data), cwd=ROOT, env=worker_env(devices, **cache, **multi),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def kill_after(procs, path, timeout_s: float = TIMEOUT_S) -> None:
    """SIGKILL every process as soon as `path` exists."""
    deadline = time.monotonic() + timeout_s
    try:
        while not path.exists():
            assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
            for p in procs:
                if p.poll() is not None:
                    pytest.fail(f"process exited ({p.returncode}) before {path} was written:\n"
                                + p.communicate()[0][-4000:])
            time.sleep(0.02)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate()


def params_of(run_dir):
    """(step, leaves) of the run's last checkpoint, and the leaves its model started from."""
    model, meta, step = load_run(run_dir)
    init = GPT(config_from_dict(meta["model"]), rngs=nnx.Rngs(meta["train"]["seed"]))
    leaves = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    return step, leaves, [np.asarray(x) for x in jax.tree.leaves(nnx.state(init, nnx.Param))]


def train_losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert steps == list(range(1, STEPS + 1)), steps  # each step once: one writer, truncated on resume
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.slow
def test_train_gpt_two_processes_killed_resumed_match_one_process(tmp_path):
    data = tiny_mnist(tmp_path / "mnist.npz")
    multi, single = tmp_path / "multi", tmp_path / "single"
    [reference] = launch(single, data, processes=1, devices=2)  # beside the others: ~35 s in all, not ~45
    try:
        kill_after(launch(multi, data, processes=2, devices=1), multi / "g" / "checkpoints" / "4" / "sha256.json")
        logs = wait(launch(multi, data, processes=2, devices=1))
    except BaseException:
        reference.kill()
        raise
    wait([reference])

    summary = json.loads((multi / "g" / "summary.json").read_text())
    assert 0 < summary["resumed_from"] < STEPS and summary["steps"] == STEPS
    assert f"from step {summary['resumed_from']}" in logs[0]
    assert not list((multi / "g" / "checkpoints").glob("damaged-*"))  # every digest matched its files
    assert sorted(p.name for p in (multi / "g").iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in (single / "g").iterdir() if not p.name.startswith("."))
    step, resumed, init = params_of(multi / "g")
    step_1, straight, _ = params_of(single / "g")
    assert step == step_1 == STEPS
    for a, b, a0 in zip(resumed, straight, init, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert max(float(np.max(np.abs(a - a0))) for a, a0 in zip(resumed, init)) > 1e-3  # it trained
    losses, losses_1 = train_losses(multi / "g"), train_losses(single / "g")
    assert losses == pytest.approx(losses_1, rel=1e-5)
