"""Loss functions per family and the pure, jitted train / eval steps over NNX split state.

The model is split once (`nnx.split(model, nnx.Param, ...)`): a static graphdef, the
parameters, and the rest (dropout RNG streams). `train_step` is a pure function of
(state, batch, key), jitted once with the state's buffers donated; every call merges the
graphdef with the traced parameters, so no Python walks the object graph per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from txjax.ops import token_nll
from txjax.train.config import TrainConfig
from txjax.train.optim import averaged_params, make_optimizer, make_schedule
from txjax.train.sharding import Layout, make_mesh

Batch = dict[str, Any]


class LossSums(NamedTuple):
    """Sums over one batch; dividing by `count` gives means over real (non -100) tokens."""

    nll: jax.Array  # summed negative log-likelihood, nats
    count: jax.Array  # number of real target tokens
    correct: jax.Array  # real tokens whose argmax prediction is right


def token_sums(logits_BTV: jax.Array, labels_BT: jax.Array) -> LossSums:
    """NLL, token count and correct count for labels that are not -100."""
    nll_BT, weights_BT = token_nll(logits_BTV, labels_BT)
    correct_BT = (jnp.argmax(logits_BTV, axis=-1) == labels_BT) & weights_BT
    return LossSums(jnp.sum(nll_BT), jnp.sum(weights_BT).astype(jnp.float32),
                    jnp.sum(correct_BT).astype(jnp.float32))


def gpt_loss(model, batch: Batch) -> LossSums:
    """batch: inputs [B, T], targets [B, T] (-100 ignored), optional document_ids [B, T] (packed rows)."""
    return token_sums(model(batch["inputs"], document_ids_BT=batch.get("document_ids")), batch["targets"])


def bert_loss(model, batch: Batch) -> LossSums:
    """batch: inputs [B, T] (masked), targets [B, T] (-100 where not predicted), optional segment_ids
    and document_ids (packed rows)."""
    return token_sums(model(batch["inputs"], batch.get("segment_ids"), document_ids_BT=batch.get("document_ids")),
                      batch["targets"])


def t5_loss(model, batch: Batch) -> LossSums:
    """batch: enc_inputs [B, S], dec_inputs [B, T] (targets shifted right), targets [B, T]; packed
    pairs add enc_document_ids [B, S] and dec_document_ids [B, T]."""
    logits_BTV = model(batch["enc_inputs"], batch["dec_inputs"], batch.get("enc_document_ids"),
                       batch.get("dec_document_ids"))
    return token_sums(logits_BTV, batch["targets"])


LOSSES: dict[str, Callable[[Any, Batch], LossSums]] = {"gpt": gpt_loss, "bert": bert_loss, "t5": t5_loss}


class TrainState(NamedTuple):
    """Everything a step changes: parameters, optimizer moments, and the step count."""

    params: Any  # nnx.State of nnx.Param
    opt_state: Any  # optax state
    step: jax.Array  # int32 scalar: optimizer steps taken


def fresh_rngs(rest, key: jax.Array):
    """The non-parameter state with every RNG key replaced by fold_in(key, i) and counts zeroed.

    Why: dropout keys become a pure function of (seed, step), so a resumed run draws
    exactly the same masks without checkpointing RNG state, and each dropout layer
    still gets its own key.
    """
    leaves, treedef = jax.tree.flatten(rest)
    out = []
    for i, leaf in enumerate(leaves):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            out.append(jax.random.wrap_key_data(
                jax.random.key_data(jax.random.fold_in(key, i)), impl=jax.random.key_impl(leaf)))
        else:
            out.append(jnp.zeros_like(leaf))
    return jax.tree.unflatten(treedef, out)


class Stepper:
    """Owns the split model, the optimizer and the two jitted steps.

    `train_step(state, batch, key) -> (state, metrics)`: the state is donated. `step_leaves` is
    the same jitted step over the state's leaves (`jax.tree.leaves(state)`), which `fit` keeps
    between steps: flattening and rebuilding nnx's state in Python costs 1-2 ms a step, 2-4% of
    a small CPU step (measured on the studies' models). The batch
    holds `batch_size` examples; with `grad_accum = A` they are cut into A micro-batches
    whose summed NLL gradients are divided by the total real-token count of all A, so the
    result equals one big batch. metrics: loss, accuracy, tokens, grad_norm, lr (device arrays).
    `eval_step(params, batch) -> LossSums` runs the model with dropout off.
    With `cfg.parallelism` "dp" or "fsdp" the state lives on `mesh` (default: all devices)
    as `self.layout` says, and both steps take host batches (see txjax.train.sharding); in a
    multi-process run the train step also takes this process's rows of the batch.
    """

    def __init__(self, model: nnx.Module, loss_fn: Callable[[Any, Batch], LossSums], cfg: TrainConfig,
                 mesh: jax.sharding.Mesh | None = None):
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.eval_graphdef = nnx.split(nnx.view(model, deterministic=True, raise_if_not_found=False),
                                       nnx.Param, ...)[0]
        self.init_params = params
        self.optimizer = make_optimizer(cfg, params)
        self.schedule = make_schedule(cfg)
        self.layout = None if cfg.parallelism == "none" else Layout(
            make_mesh() if mesh is None else mesh, cfg.parallelism)
        state_like = jax.eval_shape(self._fresh_state, params)
        self.state_def = jax.tree.structure(state_like)
        if self.layout is None:
            self.step_leaves = jax.jit(self._step_leaves, donate_argnums=(0,))
            self.eval_step = jax.jit(self._eval_step)
        else:
            if cfg.micro_batch_size % self.layout.size:
                raise ValueError(
                    f"batch_size / grad_accum = {cfg.micro_batch_size} examples cannot be split "
                    f"over {self.layout.size} devices"
                )
            self.step_leaves = self.layout.jit_train_step(self._step_leaves, jax.tree.leaves(state_like),
                                                          cfg.batch_size)
            self.eval_step = self.layout.jit_eval_step(self._eval_step, params)

    def train_step(self, state: TrainState, batch: Batch, key: jax.Array):
        """(state, metrics) after one step; `step_leaves` on the state's leaves."""
        leaves, metrics = self.step_leaves(self.leaves(state), batch, key)
        return jax.tree.unflatten(self.state_def, leaves), metrics

    def leaves(self, state: TrainState) -> list:
        """The leaves `step_leaves` takes; raises if `state` is not this stepper's."""
        leaves, treedef = jax.tree.flatten(state)
        if treedef != self.state_def:
            raise ValueError(f"train state of structure {treedef} is not this stepper's {self.state_def}")
        return leaves

    def _step_leaves(self, leaves: list, batch: Batch, key: jax.Array):
        state, metrics = self._train_step(jax.tree.unflatten(self.state_def, leaves), batch, key)
        return self.leaves(state), metrics

    def _fresh_state(self, params) -> TrainState:
        return TrainState(params, self.optimizer.init(params), jnp.zeros((), jnp.int32))

    def init_state(self, params=None) -> TrainState:
        state = self._fresh_state(self.init_params if params is None else params)
        return state if self.layout is None else self.layout.put(state)

    def eval_params(self, state: TrainState):
        """The parameters to evaluate, score and sample with: the moving average with
        `cfg.ema_decay`, else the trained parameters themselves."""
        return averaged_params(state.opt_state, self.cfg.ema_decay) if self.cfg.ema_decay else state.params

    def model(self, params, *, train: bool = False) -> nnx.Module:
        """A module built from `params` (dropout off unless train=True)."""
        return nnx.merge(self.graphdef if train else self.eval_graphdef, params, self.rest)

    def _micro_batches(self, batch: Batch) -> Batch:
        a = self.cfg.grad_accum

        def split(x):
            x = jnp.asarray(x)
            if x.shape[0] % a:
                raise ValueError(f"batch of {x.shape[0]} examples is not divisible by grad_accum={a}")
            return x.reshape(a, x.shape[0] // a, *x.shape[1:])

        return jax.tree.map(split, batch)

    def gradients(self, params, batch: Batch, key: jax.Array, step: jax.Array):
        """(grads, sums): the gradient of the batch's mean NLL over its real tokens, before the optimizer.

        The micro-batches' summed-NLL gradients are added up and divided once by the real-token
        count of the whole batch, so any `grad_accum` gives the one-big-batch gradient.
        """
        step_key = jax.random.fold_in(key, step)

        def micro_loss(params, micro, i):
            rest = fresh_rngs(self.rest, jax.random.fold_in(step_key, i))
            if self.layout is not None:
                params = self.layout.gather(params)
            sums = self.loss_fn(nnx.merge(self.graphdef, params, rest), micro)
            return sums.nll, sums

        grad_fn = jax.grad(micro_loss, has_aux=True)

        def body(carry, xs):
            grads_acc, sums_acc = carry
            micro, i = xs
            grads, sums = grad_fn(params, micro, i)
            return (jax.tree.map(jnp.add, grads_acc, grads),
                    jax.tree.map(jnp.add, sums_acc, sums)), None

        micro = self._micro_batches(batch)
        if self.layout is not None:
            micro = self.layout.split_micro(micro)
        if self.cfg.grad_accum == 1:
            # No loop around a single micro-batch: the scan's carried zeros and adds cost
            # ~2% of a small CPU train step (measured), and nothing is gained by the loop.
            grads, sums = grad_fn(params, jax.tree.map(lambda x: x[0], micro), 0)
        else:
            zero_grads = jax.tree.map(jnp.zeros_like, params)
            zero_sums = LossSums(*(jnp.zeros((), jnp.float32) for _ in range(3)))
            (grads, sums), _ = jax.lax.scan(
                body, (zero_grads, zero_sums), (micro, jnp.arange(self.cfg.grad_accum)))
        count = jnp.maximum(sums.count, 1.0)
        return jax.tree.map(lambda g: g / count, grads), sums

    def _train_step(self, state: TrainState, batch: Batch, key: jax.Array):
        grads, sums = self.gradients(state.params, batch, key, state.step)
        count = jnp.maximum(sums.count, 1.0)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": sums.nll / count,
            "accuracy": sums.correct / count,
            "tokens": sums.count,
            "grad_norm": optax.tree.norm(grads),
            "lr": self.schedule(state.step),
        }
        return TrainState(params, opt_state, state.step + 1), metrics

    def _eval_step(self, params, batch: Batch) -> LossSums:
        return self.loss_fn(self.model(params), batch)

    def evaluate(self, params, batches) -> dict[str, float]:
        """Mean loss and accuracy over real tokens of all `batches` (an iterable of batches)."""
        total = None
        for batch in batches:
            sums = self.eval_step(params, batch)
            total = sums if total is None else jax.tree.map(jnp.add, total, sums)
        if total is None:
            raise ValueError("evaluate: no batches")
        nll, count, correct = (float(x) for x in jax.device_get(total))
        count_ = max(count, 1.0)
        return {"loss": nll / count_, "accuracy": correct / count_, "tokens": count}
