"""txjax.train.sharding: DP and FSDP on 8 CPU devices, and two processes on localhost.

The multi-device checks run tests/sharding_worker.py in a fresh process: the device
count (XLA_FLAGS) and jax.distributed must be set before JAX starts, and this process
has already started it.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from txjax.train.config import TrainConfig
from txjax.train.sharding import Layout, fsdp_spec, initialize_distributed, make_mesh

WORKER = Path(__file__).with_name("sharding_worker.py")
ROOT = WORKER.parent.parent
TIMEOUT_S = 540


def worker_env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    flags = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **extra)
    return env


def run_worker(check: str, tmp_path: Path, devices: int = 8) -> dict:
    out = tmp_path / f"{check}.json"
    proc = subprocess.run([sys.executable, str(WORKER), check, str(out)], cwd=ROOT,
                          env=worker_env(devices), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_fsdp_spec_splits_the_largest_divisible_dimension():
    assert fsdp_spec((32, 64), 8) == P(None, "data")
    assert fsdp_spec((64, 32), 8) == P("data", None)
    assert fsdp_spec((16, 16), 8) == P("data", None)  # first on ties
    assert fsdp_spec((12, 16), 8) == P(None, "data")  # 12 does not divide
    assert fsdp_spec((3, 5), 8) == P()
    assert fsdp_spec((4,), 8) == P()  # fewer rows than devices
    assert fsdp_spec((), 8) == P()


def test_parallelism_and_layout_are_validated():
    with pytest.raises(ValueError, match="TrainConfig.parallelism='tp'"):
        TrainConfig(parallelism="tp")
    with pytest.raises(ValueError, match="'dp' or 'fsdp'"):
        Layout(make_mesh(), "none")
    with pytest.raises(ValueError, match="one axis named 'data'"):
        Layout(jax.sharding.Mesh(np.asarray(jax.devices()), ("batch",)), "dp")


def test_layout_shardings_on_one_device():
    layout = Layout(make_mesh(jax.devices()[:1]), "fsdp")
    tree = {"kernel": np.ones((4, 6), np.float32), "count": np.zeros((), np.int32)}
    placed = layout.put(tree)
    assert placed["kernel"].sharding.spec == P(None, "data")
    assert placed["count"].sharding.spec == P()
    np.testing.assert_array_equal(np.asarray(placed["kernel"]), tree["kernel"])
    batch = layout.put_batch({"x": np.arange(6).reshape(3, 2)})
    assert batch["x"].sharding.spec == P("data")


def test_initialize_distributed_needs_all_three(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TXJAX_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    assert initialize_distributed() is False  # single process: nothing to do
    monkeypatch.setenv("TXJAX_DISTRIBUTED", "yes")
    with pytest.raises(ValueError, match="expected auto or nothing"):
        initialize_distributed()
    monkeypatch.delenv("TXJAX_DISTRIBUTED")
    with pytest.raises(ValueError, match="all three"):
        initialize_distributed("127.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="all three"):
        initialize_distributed()


def assert_matches_single_device(result: dict, mode: str, devices: int, tol: float = 1e-5):
    none, sharded = result["none"], result[mode]
    np.testing.assert_allclose(sharded["losses"], none["losses"], rtol=1e-5)
    assert sharded["eval"]["tokens"] == none["eval"]["tokens"]
    np.testing.assert_allclose(sharded["eval"]["loss"], none["eval"]["loss"], rtol=1e-5)
    # The worker's Adam eps (1e-3) keeps the update Lipschitz in the gradient, so
    # reduction-order noise of ~1e-7 stays ~1e-7 in the parameters (seen: 1.2e-7; with
    # eps 1e-8 it was 2.4e-5 and could reach lr = 1e-2 on a near-zero gradient).
    assert sharded["max_param_diff"] < tol
    assert none["params"]["specs"] == ["single device"]
    for part in ("params", "mu"):
        report = sharded[part]
        assert report["devices"] == [devices]
        if mode == "dp":
            assert report["split"] == 0 and report["specs"] == ["P()"]
        else:  # every leaf of this tiny model has a dimension divisible by the device count
            assert report["split"] == report["leaves"] > 0
            assert report["split_bytes_per_device_ratio"] == pytest.approx(1 / devices)


@pytest.mark.slow
def test_dp_and_fsdp_steps_match_one_device(tmp_path):
    """GPT, grad_accum 2, dropout 0.1, 3 steps on 8 CPU devices: same loss and parameters."""
    result = run_worker("steps", tmp_path)
    assert result["device_count"] == 8
    losses = result["none"]["losses"]
    assert losses[-1] < losses[0]
    for mode in ("dp", "fsdp"):
        assert_matches_single_device(result, mode, 8)
    assert "cannot be split over 8 devices" in result["indivisible_error"]


@pytest.mark.slow
def test_fsdp_t5_matches_one_device(tmp_path):
    """Encoder-decoder with padding and the relative-bias table, sharded over 8 devices."""
    result = run_worker("t5", tmp_path)
    assert_matches_single_device(result, "fsdp", 8)


@pytest.mark.slow
def test_fsdp_run_stops_resumes_and_matches_unsharded_run(tmp_path):
    """train_run with parallelism="fsdp": sharded Orbax checkpoint at step 2, resumed to 4."""
    result = run_worker("resume", tmp_path)
    assert result["stopped_at"] == 2 and result["resumed_from"] == 2
    np.testing.assert_allclose(result["loss_fsdp"], result["loss_none"], rtol=1e-5)
    assert result["max_param_diff"] < 1e-5 and result["max_opt_diff"] < 1e-5  # seen: 3e-8, 8e-9
    assert result["resumed_params"]["split"] == result["resumed_params"]["leaves"]


@pytest.mark.slow
def test_all_finite_on_many_sharded_leaves_is_one_program(tmp_path):
    """all_finite before a checkpoint, on 196 FSDP leaves over 8 devices: finishes (it deadlocked
    XLA:CPU when it was two eager ops per leaf) and still finds one NaN."""
    result = run_worker("queue", tmp_path)
    assert result["leaves"] == result["split"] == 196
    assert result["finite"] == [True] * 4 and result["broken"] is False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(procs: list[subprocess.Popen]) -> list[str]:
    """Each process's output, once all have exited 0; any still running is killed (timeout, failure)."""
    try:
        logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return logs


@pytest.mark.slow
def test_two_processes_on_localhost(tmp_path):
    """jax.distributed over 127.0.0.1, 2 processes x 2 CPU devices, gloo collectives:
    FSDP over the 4-device mesh equals one device in each process."""
    port = free_port()
    procs = []
    for pid in range(2):
        env = worker_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                         JAX_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), "multihost", str(tmp_path / f"p{pid}.json")], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    wait(procs)
    results = [json.loads((tmp_path / f"p{pid}.json").read_text()) for pid in range(2)]
    for pid, result in enumerate(results):
        assert (result["process_index"], result["process_count"]) == (pid, 2)
        assert (result["local_devices"], result["devices"]) == (2, 4)
        assert_matches_single_device(result, "fsdp", 4)
    assert results[0]["fsdp"]["losses"] == results[1]["fsdp"]["losses"]
