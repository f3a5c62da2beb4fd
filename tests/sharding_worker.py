"""Sharded training checks run in a fresh process by tests/test_sharding.py.

A fresh process because the device count (XLA_FLAGS) and `jax.distributed` must be set
before JAX starts its backend, and pytest's process already has. Usage:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharding_worker.py CHECK OUT.json
    JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=i \\
        python tests/sharding_worker.py multihost OUT.json

CHECK is one of `steps` (GPT: none / dp / fsdp), `t5` (none / fsdp), `resume`
(train_run with fsdp, stopped and resumed, against an unsharded run) or `queue` (the
finiteness check on a sharded model with many leaves). Writes JSON of
measurements to OUT; the test makes the assertions.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile

from txjax.train.sharding import initialize_distributed

MULTI = initialize_distributed()  # before anything touches a device

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from txjax import GPT, T5, GPTConfig, T5Config  # noqa: E402
from txjax.train.config import TrainConfig  # noqa: E402
from txjax.train.steps import Stepper, gpt_loss, t5_loss  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

GPT_TINY = GPTConfig(vocab_size=64, max_len=16, d_model=32, num_heads=4, num_layers=1, d_ff=64,
                     dropout=0.1)
T5_TINY = T5Config(vocab_size=64, max_len=16, d_model=32, num_heads=4, num_layers=1, d_ff=64,
                   dropout=0.1)


def gpt_batch(n=16, t=9, seed=0):
    rows = np.random.default_rng(seed).integers(0, GPT_TINY.vocab_size, (n, t)).astype(np.int32)
    return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


def t5_batch(n=16, seed=0):
    rng = np.random.default_rng(seed)
    enc = rng.integers(2, T5_TINY.vocab_size, (n, 10)).astype(np.int32)
    enc[:4, 7:] = 0  # padding, masked as keys
    targets = rng.integers(2, T5_TINY.vocab_size, (n, 6)).astype(np.int32)
    dec = np.concatenate([np.zeros((n, 1), np.int32), targets[:, :-1]], axis=1)
    return {"enc_inputs": enc, "dec_inputs": dec, "targets": targets}


def host(tree):
    """Every leaf as a NumPy array on this host (gathered across processes when needed)."""
    from jax.experimental import multihost_utils

    def one(x):
        if x.is_fully_addressable:
            return np.asarray(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def sharding_report(tree) -> dict:
    """How many leaves are split, and whether every device holds less than the whole of them."""
    leaves = jax.tree.leaves(tree)
    split = [x for x in leaves if not x.sharding.is_fully_replicated]
    return {
        "leaves": len(leaves),
        "split": len(split),
        "replicated": len(leaves) - len(split),
        "split_bytes_per_device_ratio": (
            sum(x.addressable_shards[0].data.size for x in split) / max(sum(x.size for x in split), 1)
        ),
        "specs": sorted({str(getattr(x.sharding, "spec", "single device")) for x in leaves}),
        "devices": sorted({len(x.sharding.device_set) for x in leaves}),
    }


def run_steps(model_fn, loss_fn, batch, parallelism, steps=3, grad_accum=2):
    # Adam's eps of 1e-3, not 1e-8: with a tiny eps a parameter whose gradient is ~0 moves by
    # lr * g / (|g| + eps), a step of size lr decided by the reduction order's rounding noise,
    # so sharded and unsharded runs may differ by lr there. With eps 1e-3 the update is
    # Lipschitz in g (slope <= lr / eps), and parameters compare to ~1e-6.
    cfg = TrainConfig(batch_size=16, grad_accum=grad_accum, warmup_steps=0, learning_rate=1e-2,
                      steps=10, parallelism=parallelism, eps=1e-3)
    stepper = Stepper(model_fn(), loss_fn, cfg)
    state = stepper.init_state()
    losses = []
    for _ in range(steps):
        state, metrics = stepper.train_step(state, batch, jax.random.key(7))
        losses.append(float(metrics["loss"]))
    out = {"losses": losses, "eval": stepper.evaluate(state.params, [batch]),
           "params": sharding_report(state.params),
           "mu": sharding_report(state.opt_state[1][0].mu)}
    return out, host(state.params)


def check_steps() -> dict:
    model = lambda: GPT(GPT_TINY, rngs=nnx.Rngs(0))  # noqa: E731
    out, ref = run_steps(model, gpt_loss, gpt_batch(), "none")
    result = {"none": out}
    for mode in ("dp", "fsdp"):
        out, params = run_steps(model, gpt_loss, gpt_batch(), mode)
        result[mode] = {**out, "max_param_diff": max_diff(ref, params)}
    try:
        Stepper(model(), gpt_loss, TrainConfig(batch_size=12, grad_accum=3, parallelism="dp"))
        result["indivisible_error"] = None
    except ValueError as err:
        result["indivisible_error"] = str(err)
    return result


def check_t5() -> dict:
    model = lambda: T5(T5_TINY, rngs=nnx.Rngs(0))  # noqa: E731
    out, ref = run_steps(model, t5_loss, t5_batch(), "none", steps=2, grad_accum=1)
    fsdp, params = run_steps(model, t5_loss, t5_batch(), "fsdp", steps=2, grad_accum=1)
    return {"none": out, "fsdp": {**fsdp, "max_param_diff": max_diff(ref, params)}}


def check_resume() -> dict:
    from txjax.data import BatchIterator
    from txjax.train.experiment import RunConfig, train_run

    rows = np.random.default_rng(1).integers(0, GPT_TINY.vocab_size, (64, 9)).astype(np.int32)
    cfg = TrainConfig(batch_size=16, grad_accum=2, steps=4, warmup_steps=1, checkpoint_every=2,
                      learning_rate=1e-2, progress=False, log_every=1, eps=1e-3)  # eps: see run_steps

    def run(tmp, name, cfg, stop_at=None):
        batches = BatchIterator(rows, cfg.batch_size, seed=cfg.seed,
                                transform=lambda r, rng=None: {"inputs": r[:, :-1], "targets": r[:, 1:]})
        return train_run(GPT(GPT_TINY, rngs=nnx.Rngs(0)), gpt_loss, cfg,
                         RunConfig(name=name, runs_dir=tmp), batches, stop_at=stop_at,
                         log=lambda *_: None)

    with tempfile.TemporaryDirectory() as tmp:
        _, straight, s1 = run(tmp, "none", cfg)
        fsdp = cfg.replace(parallelism="fsdp")
        _, _, half = run(tmp, "fsdp", fsdp, stop_at=2)
        _, resumed, s2 = run(tmp, "fsdp", fsdp)
        return {
            "stopped_at": half["steps"], "resumed_from": s2["resumed_from"],
            "loss_none": s1["train_loss"], "loss_fsdp": s2["train_loss"],
            "max_param_diff": max_diff(host(straight.params), host(resumed.params)),
            "max_opt_diff": max_diff(host(straight.opt_state), host(resumed.opt_state)),
            "resumed_params": sharding_report(resumed.params),
        }


def check_queue() -> dict:
    """`all_finite` (run before every checkpoint) on a 12-layer sharded GPT's 196 leaves:
    eagerly, two multi-device programs per leaf, and XLA:CPU deadlocks in a collective with
    ~32+ of them in flight; jitted, one program."""
    from txjax.train.loop import all_finite

    cfg = TrainConfig(batch_size=16, steps=10, parallelism="fsdp")
    stepper = Stepper(GPT(dataclasses.replace(GPT_TINY, num_layers=12), rngs=nnx.Rngs(0)), gpt_loss, cfg)
    params = stepper.init_state().params
    leaves, treedef = jax.tree.flatten(params)
    last = leaves[-1].at[(0,) * leaves[-1].ndim].set(np.nan)  # keeps its sharding
    broken = jax.tree.unflatten(treedef, leaves[:-1] + [last])
    return {"leaves": len(jax.tree.leaves(params)), "finite": [all_finite(params) for _ in range(4)],
            "broken": all_finite(broken), "split": sharding_report(params)["split"]}


def check_multihost() -> dict:
    model = lambda: GPT(GPT_TINY, rngs=nnx.Rngs(0))  # noqa: E731
    result = {"process_index": jax.process_index(), "process_count": jax.process_count(),
              "local_devices": jax.local_device_count(), "devices": jax.device_count()}
    none, ref = run_steps(model, gpt_loss, gpt_batch(), "none", steps=2)  # on this process's first device
    result["none"] = none
    out, params = run_steps(model, gpt_loss, gpt_batch(), "fsdp", steps=2)
    result["fsdp"] = {**out, "max_param_diff": max_diff(ref, params)}
    return result


CHECKS = {"steps": check_steps, "t5": check_t5, "resume": check_resume, "queue": check_queue,
          "multihost": check_multihost}

if __name__ == "__main__":
    name, out_path = sys.argv[1], sys.argv[2]
    result = CHECKS[name]()
    result["device_count"] = jax.device_count()
    if jax.process_index() == 0 or name == "multihost":
        with open(out_path, "w") as f:
            json.dump(result, f)
    if MULTI:
        jax.distributed.shutdown()
    print(json.dumps({k: v for k, v in result.items() if k != "none"})[:2000])
