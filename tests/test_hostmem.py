"""txjax.hostmem: a train step's scratch buffer comes back from the heap, not as fresh pages."""

import json
import os
import platform
import subprocess
import sys

import pytest

from txjax import hostmem

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# A small GPT train step with the reference attention (its XLA temp buffer is ~39 MB, above
# glibc's 32 MB mmap ceiling; the fused CPU attention keeps no [B, N, T, T] scores and stays
# under it): page faults of each warm step, and the temp buffer's size in pages. The
# process imports everything first and then, as the entry points do in their
# `__main__` block, calls `reuse_host_memory()` (or, with argv[1] "import", does not);
# argv[2] is the number of steps, of which the first 3 (compiling, warming up) are not reported.
PROBE = """
import json, resource, sys
import txjax, jax
from txjax import bench, hostmem
if sys.argv[1] == "call":
    hostmem.reuse_host_memory()
from txjax.config import ExecutionConfig
from txjax.train.config import TrainConfig
from txjax.train.steps import LOSSES, Stepper
config = bench.config_from_args(bench.parse_args(
    ["--seq", "128", "--d-model", "64", "--heads", "2", "--layers", "2", "--d-ff", "256"]))
stepper = Stepper(bench.build_model(config, execution=ExecutionConfig(attention_impl="reference")), LOSSES["gpt"],
                  TrainConfig(batch_size=20, steps=100, warmup_steps=1, progress=False))
state, batch, key = stepper.init_state(), bench.make_batch(config, 20, 128), jax.random.key(0)
temp = stepper.step_leaves.lower(stepper.leaves(state), batch, key).compile().memory_analysis().temp_size_in_bytes
faults = []
for _ in range(int(sys.argv[2])):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state, metrics = stepper.train_step(state, batch, key)
    jax.block_until_ready(metrics)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"temp_pages": temp // 4096, "faults": faults[3:]}))
"""


def step_faults(malloc_env: str | None, mode: str = "call", steps: int = 9) -> tuple[int, list[int]]:
    env = {k: v for k, v in os.environ.items() if k != hostmem.ENV}
    if malloc_env is not None:
        env[hostmem.ENV] = malloc_env
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(steps)], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    result = json.loads(out.stdout.splitlines()[-1])
    return result["temp_pages"], sorted(result["faults"])


def test_warm_train_steps_reuse_their_scratch_pages():
    # While the heap settles, a step now and then still gets fresh pages for the whole buffer
    # (measured, 2026-12-06: of 16 steps, some of steps 2-4 in two runs of six, and a later one
    # in one run of six; under load once most of steps 3-8). So the median of 13 warm steps.
    pages, faults = step_faults(None, steps=16)
    assert pages > 32 * 2**20 // 4096  # big enough that glibc would have mmapped it
    assert faults[len(faults) // 2] < 0.05 * pages  # the median step faults in almost nothing


def test_opt_out_leaves_glibc_faulting_the_scratch_buffer_in_every_step():
    # The contrast that shows the probe measures the buffer: ~every page, every step.
    pages, faults = step_faults("default")
    assert faults[0] > 0.9 * pages


def test_importing_txjax_alone_leaves_malloc_alone():
    # No import-time effect: without the entry points' explicit call, glibc's default stays.
    pages, faults = step_faults(None, mode="import")
    assert faults[0] > 0.9 * pages


def test_opt_out_is_honoured(monkeypatch):
    monkeypatch.setenv(hostmem.ENV, "default")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert hostmem.reuse_host_memory() is False


@pytest.mark.parametrize("platforms", ["cuda", "tpu,cpu", "rocm"])
def test_left_alone_when_jax_runs_on_an_accelerator(monkeypatch, platforms):
    monkeypatch.delenv(hostmem.ENV, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert hostmem.reuse_host_memory() is False
