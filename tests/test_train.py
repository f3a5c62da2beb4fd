"""txjax.train: optimizer mask and schedule, steps, accumulation, checkpoints, resume, NaN stop."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from txjax import GPT, GPTConfig
from txjax.config import ExecutionConfig
from txjax.data import BatchIterator
from txjax.ops import cross_entropy
from txjax.train.checkpoint import Checkpointer, CheckpointMismatch, check_compatible
from txjax.train.config import TrainConfig
from txjax.train.experiment import RunConfig, train_run
from txjax.train.loop import NonFiniteLoss, RunDirError, fit, prepare_run_dir, read_metrics
from txjax.train.optim import (
    averaged_params,
    decay_mask,
    make_optimizer,
    make_schedule,
    param_bounds,
    param_ema,
    project_to_bounds,
    relative_bias_mask,
)
from txjax.train.steps import Stepper, gpt_loss, token_sums

TINY = GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, num_layers=1, d_ff=32)


def tiny_model(dropout=0.0, seed=0):
    return GPT(dataclasses.replace(TINY, dropout=dropout), rngs=nnx.Rngs(seed))


def random_rows(n=32, t=9, seed=0):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, (n, t)).astype(np.int32)


def shift(rows, rng=None):
    return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


def test_decay_mask_only_kernels():
    mask = decay_mask(nnx.state(tiny_model(), nnx.Param))
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert flat and all(v == ("kernel" in k) for k, v in flat.items())
    assert any("embedding" in k for k in flat) and any("scale" in k for k in flat)
    assert not any(v for k, v in flat.items() if "embedding" in k or "bias" in k or "scale" in k)


@pytest.mark.parametrize("position", ["t5", "kerple"])
def test_relative_bias_lr_multiplier_scales_only_the_relative_bias_updates(position):
    """Adam's first step moves every parameter by ~lr; with the multiplier m the relative bias moves m times as far."""
    model = GPT(dataclasses.replace(TINY, position=position), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5), params)
    mask = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(relative_bias_mask(params))[0]}
    assert any(mask.values()) and all(v == ("relative" in k) for k, v in mask.items())
    updates = {}
    for m in (1.0, 10.0):
        cfg = TrainConfig(learning_rate=1e-3, warmup_steps=0, weight_decay=0.1, relative_bias_lr_multiplier=m)
        opt = make_optimizer(cfg, params)
        u, _ = opt.update(grads, opt.init(params), params)
        updates[m] = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(u)[0]}
    for k, relative in mask.items():
        np.testing.assert_allclose(updates[10.0][k], updates[1.0][k] * (10.0 if relative else 1.0), rtol=1e-6)
    np.testing.assert_allclose(next(v for k, v in updates[1.0].items() if mask[k]), -1e-3, rtol=1e-3)


@pytest.mark.parametrize("bounds", [(0.01, None), (None, 2.0), (-1.0, 1.0)])
def test_project_to_bounds_lands_each_bounded_parameter_inside_and_leaves_the_rest(bounds):
    """p + u' = clip(p + u, low, high) for the bounded leaf, to within one rounding of p + u - p;
    where p + u stays inside, and for the other leaf, the update is passed through untouched."""
    rng = np.random.default_rng(0)
    p = {"a": jnp.asarray(rng.normal(size=64), jnp.float32), "b": jnp.asarray(rng.normal(size=8), jnp.float32)}
    u = {"a": jnp.asarray(3 * rng.normal(size=64), jnp.float32), "b": jnp.asarray(rng.normal(size=8), jnp.float32)}
    opt = project_to_bounds([bounds, None])
    out, _ = opt.update(u, opt.init(p), p)
    new = optax.apply_updates(p, out)
    moved = np.asarray(p["a"]) + np.asarray(u["a"])
    clipped = np.clip(moved, *bounds)
    np.testing.assert_allclose(new["a"], clipped, rtol=0, atol=1e-6)  # on a bound: one rounding of p + (bound - p)
    np.testing.assert_array_equal(np.asarray(out["a"])[clipped == moved], np.asarray(u["a"])[clipped == moved])
    low, high = (-np.inf if bounds[0] is None else bounds[0]), (np.inf if bounds[1] is None else bounds[1])
    assert ((np.asarray(new["a"]) >= low - 1e-6) & (np.asarray(new["a"]) <= high + 1e-6)).all()
    np.testing.assert_array_equal(out["b"], u["b"])


def test_only_clamped_kerple_declares_bounds_and_only_then_the_optimizer_projects():
    """kerple_positive="clamp" bounds r1, r2 (power r2 also above); softplus KERPLE and every other
    model declare none, so their optimizer (and its state) is the one without projection."""
    for variant, r2_bounds in (("log", (0.01, None)), ("power", (0.01, 2.0))):
        model = GPT(dataclasses.replace(TINY, position="kerple", kerple_variant=variant, kerple_positive="clamp"),
                    rngs=nnx.Rngs(0))
        bounds = param_bounds(nnx.state(model, nnx.Param))
        assert [b for b in bounds if b is not None] == [(0.01, None), r2_bounds]  # raw_r1, raw_r2
        params = nnx.state(model, nnx.Param)
        assert len(make_optimizer(TrainConfig(), params).init(params)) == 3  # clip, AdamW, projection
    for position in ("kerple", "t5", "rope"):
        params = nnx.state(GPT(dataclasses.replace(TINY, position=position), rngs=nnx.Rngs(0)), nnx.Param)
        assert all(b is None for b in param_bounds(params))
        assert len(make_optimizer(TrainConfig(), params).init(params)) == 2  # clip, AdamW


def test_clamped_kerple_step_equals_the_reference_in_place_clamp():
    """The reference clamps r1, r2 in place before each forward: a step is AdamW's, then r1, r2
    clipped to >= 0.01. Fed the same gradients, the optimizer of a clamped KERPLE model gives
    exactly that: bit for bit, except the values clipped onto the floor (one rounding). A learning rate
    of 0.3 takes some r below the floor, so both branches are exercised."""
    model = GPT(dataclasses.replace(TINY, position="kerple", kerple_positive="clamp"), rngs=nnx.Rngs(0))
    cfg = TrainConfig(batch_size=8, warmup_steps=0, learning_rate=0.3, weight_decay=0.0, steps=3)
    stepper = Stepper(model, gpt_loss, cfg)
    params, batch = stepper.init_params, shift(random_rows(8))
    bounds, leaves = param_bounds(params), jax.tree.leaves(params)
    plain = make_optimizer(cfg, leaves)  # plain arrays declare no bounds: AdamW alone
    opt_state, plain_state = stepper.optimizer.init(params), plain.init(leaves)
    for step in range(3):
        grads, _ = stepper.gradients(params, batch, jax.random.key(step), jnp.int32(step))
        u, plain_state = plain.update(jax.tree.leaves(grads), plain_state, leaves)
        expected = [np.clip(np.asarray(p + d), *b) if b else np.asarray(p + d) for p, d, b in zip(leaves, u, bounds)]
        updates, opt_state = stepper.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        leaves = jax.tree.leaves(params)
        for e, g, b in zip(expected, leaves, bounds):
            inside = np.asarray(e) > 0.01 if b else np.ones(e.shape, bool)  # AdamW alone: bit for bit
            np.testing.assert_array_equal(np.asarray(g)[inside], e[inside])
            np.testing.assert_allclose(g, e, rtol=0, atol=1e-7)  # on the floor: one rounding
    floor = [np.asarray(g) for g, b in zip(leaves, bounds) if b]
    assert any((f <= 0.01 + 1e-7).any() for f in floor) and any((f > 0.02).any() for f in floor)
    state, _ = stepper.train_step(stepper.init_state(), batch, jax.random.key(0))  # the jitted step projects too
    jitted = [np.asarray(g) for g, b in zip(jax.tree.leaves(state.params), bounds) if b]
    assert all((f >= 0.01 - 1e-7).all() for f in jitted) and any((f <= 0.01 + 1e-7).any() for f in jitted)


@pytest.mark.parametrize("positive", ["softplus", "clamp"])
def test_kerple_with_r2_fixed_trains_r1_and_keeps_r2_at_its_draw(positive):
    """kerple_learn_r2=False: r2 is the reference draw itself (what a clamped model with r2 learned
    starts from, per seed), its gradient is 0, and jitted training steps that move r1 leave it
    there bit for bit."""
    config = dataclasses.replace(TINY, position="kerple", kerple_positive=positive, kerple_learn_r2=False)
    for seed in (0, 1):
        drawn = GPT(dataclasses.replace(config, kerple_positive="clamp", kerple_learn_r2=True),
                    rngs=nnx.Rngs(seed)).decoder.positions.relative.r2
        np.testing.assert_array_equal(GPT(config, rngs=nnx.Rngs(seed)).decoder.positions.relative.r2, drawn)
    stepper = Stepper(GPT(config, rngs=nnx.Rngs(1)), gpt_loss,
                      TrainConfig(batch_size=8, warmup_steps=0, learning_rate=0.1, steps=3))
    batch = shift(random_rows(8))
    grads, _ = stepper.gradients(stepper.init_params, batch, jax.random.key(0), jnp.int32(0))
    relative = grads["decoder"]["positions"]["relative"]
    assert (np.asarray(relative["raw_r2"][...]) == 0).all() and (np.asarray(relative["raw_r1"][...]) != 0).all()
    r1_start = np.asarray(stepper.model(stepper.init_params).decoder.positions.relative.r1)
    state = stepper.init_state()
    for step in range(3):
        state, _ = stepper.train_step(state, batch, jax.random.key(step))
    trained = stepper.model(state.params).decoder.positions.relative
    np.testing.assert_array_equal(trained.r2, drawn)
    assert (np.abs(np.asarray(trained.r1) - r1_start) > 1e-3).all()


def test_schedule_warmup_then_cosine():
    cfg = TrainConfig(learning_rate=1e-3, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    lr = make_schedule(cfg)
    assert float(lr(0)) == 0.0
    assert float(lr(5)) == pytest.approx(5e-4)
    assert float(lr(10)) == pytest.approx(1e-3)
    assert float(lr(60)) == pytest.approx(0.55e-3, rel=1e-4)
    assert float(lr(110)) == pytest.approx(1e-4)


@pytest.mark.parametrize("changes", [
    {"learning_rate": -1.0}, {"learning_rate": 0.0}, {"batch_size": 0}, {"steps": 0},
    {"batch_size": 6, "grad_accum": 4}, {"b2": 1.5}, {"weight_decay": -0.1}, {"ema_decay": 1.0},
    {"ema_decay": -0.5},
])
def test_train_config_rejects_bad_values(changes):
    with pytest.raises(ValueError, match="TrainConfig"):
        TrainConfig(**changes)


def test_token_sums_ignore_and_normalise():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5))
    labels = jnp.array([[1, -100, 2], [-100, -100, 4]])
    s = token_sums(logits, labels)
    assert float(s.count) == 3.0
    np.testing.assert_allclose(float(s.nll / s.count), float(cross_entropy(logits, labels)), rtol=1e-6)


@pytest.mark.slow
def test_grad_accumulation_matches_one_big_batch():
    """The accumulated gradient is the one-big-batch gradient; one AdamW step then agrees.

    Compared before the optimizer, relative to the gradient's norm. After an Adam step a
    parameter whose gradient is ~0 moves by lr * g / (|g| + eps), so rounding noise in g
    decides it: parameters are compared only where |g| is far above that noise.
    """
    rows = random_rows(8)
    batch = shift(rows)
    # Uneven real-token counts per micro-batch (6, 6, 16, 16 of 2 rows each): the division
    # must use the total count; per-micro-batch means would weigh the short rows 8/3 too much.
    batch["targets"] = batch["targets"].copy()
    batch["targets"][:4, 3:] = -100
    key = jax.random.key(0)
    results = []
    for accum in (1, 4):
        cfg = TrainConfig(batch_size=8, grad_accum=accum, warmup_steps=0, learning_rate=1e-2, steps=5)
        stepper = Stepper(tiny_model(), gpt_loss, cfg)
        state = stepper.init_state()
        grads, sums = jax.jit(stepper.gradients)(state.params, batch, key, state.step)
        new_state, metrics = stepper.train_step(state, batch, key)
        results.append((jax.device_get(grads), jax.device_get(sums), new_state.params, jax.device_get(metrics)))
    (g1, s1, p1, m1), (g4, s4, p4, m4) = results
    assert float(s1.count) == float(s4.count) == m1["tokens"] == m4["tokens"] == 4 * 3 + 4 * 8
    np.testing.assert_allclose(s1.nll, s4.nll, rtol=1e-5)
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["grad_norm"], m4["grad_norm"], rtol=1e-5)

    norm = float(m1["grad_norm"])
    assert norm > 0.1
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * norm)
    # The reference: the gradient of the mean NLL over all 44 real tokens, by hand.
    model = tiny_model()
    ref = nnx.grad(lambda m: cross_entropy(m(batch["inputs"]), batch["targets"]))(model)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(nnx.state(ref, nnx.Param))):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * norm)

    signal = 0
    for a, b, g in zip(jax.tree.leaves(p1), jax.tree.leaves(p4), jax.tree.leaves(g1)):
        clear = np.abs(g) > 1e-3 * norm  # far above float noise (~1e-7 * norm)
        signal += int(clear.sum())
        np.testing.assert_allclose(np.asarray(a)[clear], np.asarray(b)[clear], rtol=1e-5, atol=1e-6)
    assert signal > 100  # most parameters carry a clear gradient, so the step comparison bites


def test_train_step_reports_loss_of_current_params_and_learns():
    cfg = TrainConfig(batch_size=8, warmup_steps=0, learning_rate=1e-2, steps=30)
    stepper = Stepper(tiny_model(), gpt_loss, cfg)
    batch = shift(random_rows(8))
    state = stepper.init_state()
    expected = float(cross_entropy(stepper.model(state.params)(batch["inputs"]), batch["targets"]))
    losses = []
    for _ in range(30):
        state, m = stepper.train_step(state, batch, jax.random.key(0))
        losses.append(float(m["loss"]))
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert losses[-1] < 0.65 * losses[0]  # learns to memorise one batch
    assert int(state.step) == 30


@pytest.mark.parametrize("decay", [0.5, 0.9])
def test_param_ema_is_the_debiased_weighted_mean_of_the_parameters_after_each_step(decay):
    """averaged = sum_i d^(n-i) (1-d) p_i / (1 - d^n), p_i the parameters after step i: the
    weights of the steps sum to one, so parameters that never move average to themselves."""
    opt = optax.chain(optax.sgd(1.0), param_ema(decay))
    params = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(params)
    after = []
    for g in ([0.5, 1.0], [-1.0, 0.25], [2.0, 0.0], [0.0, -3.0]):
        updates, state = opt.update({"w": jnp.array(g)}, state, params)
        params = optax.apply_updates(params, updates)
        after.append(np.asarray(params["w"]))
    n = len(after)
    weights = np.array([decay ** (n - i) * (1 - decay) for i in range(1, n + 1)]) / (1 - decay ** n)
    # rtol 1e-5: float32 sums over 4 steps of terms up to ~3x the result, not one machine's rounding
    np.testing.assert_allclose(averaged_params(state, decay)["w"], weights @ np.stack(after), rtol=1e-5)
    still = optax.chain(optax.sgd(0.0), param_ema(decay))
    s = still.init(params)
    for _ in range(3):
        s = still.update({"w": jnp.ones(2)}, s, params)[1]
    np.testing.assert_allclose(averaged_params(s, decay)["w"], params["w"], rtol=1e-5)


def test_ema_run_evaluates_and_samples_with_the_average(tmp_path):
    """With ema_decay the optimizer's updates are unchanged, and evaluation, the final held-out
    numbers and `load_run` (sampling) all see the average, not the last step's parameters."""
    from txjax.tasks.sample import load_run
    cfg = TrainConfig(batch_size=8, steps=6, warmup_steps=0, learning_rate=1e-2, progress=False,
                      checkpoint_every=6, tensorboard=False)
    seen = []
    model = tiny_model()
    batches = BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift)
    stepper, state, _ = train_run(model, gpt_loss, cfg.replace(ema_decay=0.8),
                                  RunConfig(name="ema", runs_dir=str(tmp_path)), batches,
                                  eval_fn=lambda st, p: seen.append(p) or {}, log=lambda *_: None)
    _, plain, _ = _run(tmp_path, "plain", cfg, model=tiny_model())
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # the average does not steer training
    average = stepper.eval_params(state)
    loaded = nnx.state(load_run(tmp_path / "ema")[0], nnx.Param)
    for a, b, c, p in zip(jax.tree.leaves(average), jax.tree.leaves(seen[-1]), jax.tree.leaves(loaded),
                          jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-6)
    assert any(not np.allclose(a, p) for a, p in zip(jax.tree.leaves(average), jax.tree.leaves(state.params)))


@pytest.mark.slow
def test_dropout_keys_depend_on_step_and_are_reproducible():
    cfg = TrainConfig(batch_size=8, warmup_steps=0, steps=5)
    batch = shift(random_rows(8))
    out = []
    for _ in range(2):
        stepper = Stepper(tiny_model(dropout=0.5), gpt_loss, cfg)
        s0 = stepper.init_state()
        s1, m1 = stepper.train_step(s0, batch, jax.random.key(3))
        s2, m2 = stepper.train_step(s1, batch, jax.random.key(3))
        out.append((float(m1["loss"]), float(m2["loss"])))
    assert out[0] == out[1]
    evals = stepper.evaluate(s2.params, [batch]), stepper.evaluate(s2.params, [batch])
    assert evals[0] == evals[1]  # dropout is off in evaluation


def test_checkpoint_round_trip(tmp_path):
    cfg = TrainConfig(batch_size=8, warmup_steps=0, steps=5)
    stepper = Stepper(tiny_model(), gpt_loss, cfg)
    state, _ = stepper.train_step(stepper.init_state(), shift(random_rows(8)), jax.random.key(0))
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, state, {"data": {"epoch": 0}, "note": "x"})
    restored, meta = ck.restore(stepper.init_state())
    ck.close()
    assert meta == {"data": {"epoch": 0}, "note": "x"}
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))



def test_restore_params_reads_only_the_parameters(tmp_path):
    cfg = TrainConfig(batch_size=8, warmup_steps=0, steps=5)
    stepper = Stepper(tiny_model(), gpt_loss, cfg)
    state, _ = stepper.train_step(stepper.init_state(), shift(random_rows(8)), jax.random.key(0))
    ck = Checkpointer(tmp_path / "ck")
    ck.save(1, state, {"note": "x"})
    ck.close()
    ck = Checkpointer(tmp_path / "ck", read_only=True)
    params = ck.restore_params(nnx.state(tiny_model(seed=1), nnx.Param))  # another init: only the tree counts
    ck.close()
    assert jax.tree.structure(params) == jax.tree.structure(state.params)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fit_without_a_run_folder_follows_the_same_trajectory(tmp_path):
    cfg = TrainConfig(batch_size=8, warmup_steps=1, steps=4, progress=False, log_every=1)
    stepper = Stepper(tiny_model(dropout=0.1), gpt_loss, cfg)
    batches = BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift)
    ck = Checkpointer(tmp_path / "ck")
    state, summary = fit(stepper, stepper.init_state(), batches, run_dir=prepare_run_dir(tmp_path / "run"),
                         checkpointer=ck, meta={})
    ck.close()
    # No run folder, no checkpoints: any iterator of batches (here one without a data position).
    plain = iter(BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift))
    stepper2 = Stepper(tiny_model(dropout=0.1), gpt_loss, cfg)
    state2, summary2 = fit(stepper2, stepper2.init_state(), (next(plain) for _ in range(cfg.steps)))
    assert summary2["steps"] == summary["steps"] == 4
    assert summary2["train_loss"] == summary["train_loss"]
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state2.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fit_over_leaves_matches_train_step_bit_for_bit():
    """fit keeps the state as leaves between steps (Stepper.step_leaves): the same program as
    train_step, so the same parameters, optimizer state and step count to the last bit."""
    cfg = TrainConfig(batch_size=8, warmup_steps=1, steps=5, progress=False)
    rows = [shift(random_rows(8, seed=i)) for i in range(cfg.steps)]
    stepper = Stepper(tiny_model(dropout=0.1), gpt_loss, cfg)
    state, summary = fit(stepper, stepper.init_state(), iter(rows), key=jax.random.key(4))
    stepper2 = Stepper(tiny_model(dropout=0.1), gpt_loss, cfg)
    state2 = stepper2.init_state()
    for batch in rows:
        state2, metrics = stepper2.train_step(state2, batch, jax.random.key(4))
    assert isinstance(state.params, nnx.State) and int(state.step) == int(state2.step) == cfg.steps
    assert summary["train_loss"] == float(metrics["loss"])
    assert jax.tree.structure(state) == jax.tree.structure(state2)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="not this stepper's"):
        stepper.train_step(state._replace(params={"w": jnp.zeros(3)}), rows[0], jax.random.key(4))

def _run(tmp_path, name, cfg, stop_at=None, loss_fn=gpt_loss, batches=None, model=None):
    if batches is None:
        batches = BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift)
    return train_run(model or tiny_model(dropout=0.1), loss_fn, cfg,
                     RunConfig(name=name, runs_dir=str(tmp_path)), batches, stop_at=stop_at,
                     log=lambda *_: None)


class InterruptAt:
    """Batches that raise KeyboardInterrupt (Ctrl-C) on the `at`-th request."""

    def __init__(self, inner, at):
        self.inner, self.at, self.calls = inner, at, 0

    def __next__(self):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return next(self.inner)

    @property
    def state(self):
        return self.inner.state

    def set_state(self, state):
        self.inner.set_state(state)


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_the_resumed_run_continues_the_same_trajectory(tmp_path):
    """8 steps straight == Ctrl-C on the 6th batch (checkpoint at step 5, between the
    regular ones at 4 and 8), rerun, 3 more: same parameters and optimizer state."""
    cfg = TrainConfig(batch_size=8, grad_accum=2, steps=8, warmup_steps=2, checkpoint_every=4,
                      learning_rate=1e-2, progress=False, log_every=1)
    _, straight, _ = _run(tmp_path, "straight", cfg)
    batches = InterruptAt(BatchIterator(random_rows(48), cfg.batch_size, seed=cfg.seed, transform=shift), 6)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "resumed", cfg, batches=batches)
    ck = Checkpointer(tmp_path / "resumed" / "checkpoints", read_only=True)
    assert ck.all_steps() == [4, 5]  # steps 1-5 finished; the 6th batch was never drawn
    assert ck.read_meta()["data"]["step"] == 5
    ck.close()
    _, resumed, summary = _run(tmp_path, "resumed", cfg)
    assert summary["resumed_from"] == 5 and int(resumed.step) == 8
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(straight.opt_state), jax.tree.leaves(resumed.opt_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    rows = [r for r in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, 9))  # no duplicated steps after resume


def test_a_checkpoint_from_before_a_train_field_existed_is_compatible():
    """A train section saved without a later field (ema_decay) reads it as its default; a field
    that really differs is still refused."""
    current = TrainConfig().to_dict()
    older = {k: v for k, v in current.items() if k != "ema_decay"}
    check_compatible({"train": older}, {"train": (current, ())}, "here")
    with pytest.raises(CheckpointMismatch, match="train.ema_decay"):
        check_compatible({"train": older}, {"train": (TrainConfig(ema_decay=0.9).to_dict(), ())}, "here")


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = TrainConfig(batch_size=4, steps=12, warmup_steps=0, checkpoint_every=3, progress=False)
    data = shift(random_rows(48))
    data["poison"] = np.zeros(48, np.float32)
    data["poison"][24:28] = np.nan  # batch 7 without shuffling (steps count from 1)

    def poisoned_loss(model, batch):
        s = gpt_loss(model, batch)
        return s._replace(nll=s.nll + jnp.sum(batch["poison"]))

    batches = BatchIterator(data, cfg.batch_size, shuffle=False)
    with pytest.raises(NonFiniteLoss, match="step 7.*last good checkpoint is step 6"):
        _run(tmp_path, "nan", cfg, loss_fn=poisoned_loss, batches=batches)
    ck = Checkpointer(tmp_path / "nan" / "checkpoints")
    assert ck.latest_step() == 6
    state, meta = ck.restore(Stepper(tiny_model(dropout=0.1), gpt_loss, cfg).init_state())
    ck.close()
    assert meta["step"] == 6 and meta["data"]["step"] == 6
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


@pytest.mark.slow
def test_checkpoint_from_a_different_config_is_refused(tmp_path):
    cfg = TrainConfig(batch_size=8, steps=2, warmup_steps=0, checkpoint_every=1, progress=False)
    _run(tmp_path, "a", cfg)
    with pytest.raises(CheckpointMismatch, match="learning_rate"):
        _run(tmp_path, "a", cfg.replace(learning_rate=1e-2))
    other = GPT(dataclasses.replace(TINY, d_model=32, dropout=0.1), rngs=nnx.Rngs(0))
    with pytest.raises(CheckpointMismatch, match="d_model: 16 -> 32"):
        _run(tmp_path, "a", cfg, model=other)


@pytest.mark.slow
def test_a_run_resumes_under_another_execution_config(tmp_path):
    """How a model runs is not what it computes: a checkpoint made with one ExecutionConfig
    resumes under another, and config.json records the execution of the latest start."""
    cfg = TrainConfig(batch_size=8, steps=4, warmup_steps=0, checkpoint_every=2, progress=False)
    _run(tmp_path, "a", cfg, stop_at=2)
    other = ExecutionConfig(causal_block_size=None, remat=True, grad_forms="autodiff")
    model = GPT(dataclasses.replace(TINY, dropout=0.1), rngs=nnx.Rngs(0), execution=other)
    _, state, summary = _run(tmp_path, "a", cfg, model=model)
    assert summary["resumed_from"] == 2 and int(state.step) == 4
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["execution"] == other.to_dict() and "remat" not in saved["model"]


def test_unwritable_run_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RunDirError, match="cannot write to the run folder"):
        prepare_run_dir(blocker / "run")
