"""AdamW with linear warmup, cosine decay, global-norm clipping, a weight-decay mask, and bounds."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from txjax.train.config import TrainConfig

DECAYED_NAMES = ("kernel",)
"""Leaf names that get weight decay: the weight matrices of `nnx.Linear`."""


def _leaf_name(path) -> str:
    """The last named key of a state path, skipping `.value` of an nnx.Variable."""
    for key in reversed(path):
        name = getattr(key, "key", getattr(key, "name", None))
        if isinstance(name, str) and name != "value":
            return name
    return ""


def decay_mask(params):
    """A pytree of bools like `params`: True where weight decay applies.

    Only dense kernels (`.../kernel`) decay. Token and position embeddings
    (`embedding`, `table`), norm scales and biases (`scale`, `bias`) and T5's
    relative-bias table do not: decaying them pulls norms towards zero and shrinks
    rare tokens' embeddings, which is why GPT-2, nanoGPT and t5x exempt them.
    """
    return jax.tree_util.tree_map_with_path(lambda p, _: _leaf_name(p) in DECAYED_NAMES, params)


RELATIVE_BIAS_MODULE = "relative"
"""The attribute of a stack's `Positions` that holds its learned relative bias (t5, fire, kerple)."""


def _path_names(path) -> list[str]:
    return [n for n in (getattr(k, "key", getattr(k, "name", None)) for k in path) if isinstance(n, str)]


def relative_bias_mask(params):
    """A pytree of bools like `params`: True for the parameters of learned relative position biases."""
    return jax.tree_util.tree_map_with_path(lambda p, _: RELATIVE_BIAS_MODULE in _path_names(p), params)


def param_bounds(params) -> list:
    """Per leaf of `params`, in `jax.tree.leaves` order: the (low, high) its `nnx.Variable` declares
    as `bounds` metadata (`nnx.Param(x, bounds=(0.01, None))`; None: that side is open), else None."""
    return [v.get_metadata().get("bounds") if isinstance(v, nnx.Variable) else None
            for v in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))]


def project_to_bounds(bounds: list) -> optax.GradientTransformation:
    """Stateless: where p + u leaves a leaf's bounds, its update u becomes clip(p + u, low, high) - p,
    so the step lands the parameter p on the bound (to within one rounding of p + (bound - p)).
    That is the in-place clamp after each step of reference code that keeps a parameter in a
    range (KERPLE's r1, r2: `param.data.clamp(min=eps)` before every forward). Last before
    `param_ema`: it must see the final updates."""

    def project(u, p, b):
        moved = p + u
        clipped = jnp.clip(moved, *b)
        return jnp.where(clipped == moved, u, clipped - p)  # inside: the update itself, bit for bit

    def update(updates, state, params):
        u_leaves, treedef = jax.tree.flatten(updates)
        out = [u if b is None else project(u, p, b)
               for u, p, b in zip(u_leaves, jax.tree.leaves(params), bounds, strict=True)]
        return treedef.unflatten(out), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_schedule(cfg: TrainConfig) -> optax.Schedule:
    """0 -> learning_rate linearly over warmup_steps, then cosine to learning_rate*min_lr_ratio."""
    warmup = min(cfg.warmup_steps, cfg.steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(cfg.steps, warmup + 1),
        end_value=cfg.learning_rate * cfg.min_lr_ratio,
    )


class ParamEmaState(NamedTuple):
    """`param_ema`'s state: updates seen, and the (not yet debiased) average of the parameters."""

    count: jax.Array
    ema: Any


def param_ema(decay: float) -> optax.GradientTransformation:
    """Passes updates through unchanged and keeps ema <- decay ema + (1 - decay) (params + updates),
    the parameters after each step, from ema = 0. Last in a chain: it must see the final updates."""

    def init(params):
        return ParamEmaState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params):
        new = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state.ema, new)
        return updates, ParamEmaState(state.count + 1, ema)

    return optax.GradientTransformation(init, update)


def averaged_params(opt_state, decay: float):
    """The debiased average ema / (1 - decay^count) kept by `param_ema` inside `opt_state`: a
    weighted mean of the parameters after each step so far, the weights decay^(steps since)."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, ParamEmaState))
             if isinstance(s, ParamEmaState)]
    if len(found) != 1:
        raise ValueError(f"expected one ParamEmaState in the optimizer state, found {len(found)}")
    state = found[0]
    correction = 1.0 - jnp.asarray(decay, jnp.float32) ** jnp.maximum(state.count, 1)
    return jax.tree.map(lambda e: (e / correction).astype(e.dtype), state.ema)


def make_optimizer(cfg: TrainConfig, params) -> optax.GradientTransformation:
    """clip_by_global_norm(grad_clip) then AdamW(schedule), decay masked by `decay_mask(params)`;
    the relative biases' updates scaled by `relative_bias_lr_multiplier` (none decay, so that is
    their learning rate times it); then, for parameters declared with `bounds`, `project_to_bounds`;
    last, with `ema_decay`, `param_ema`."""
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    parts.append(optax.adamw(
        make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
        weight_decay=cfg.weight_decay, mask=decay_mask(params),
    ))
    if cfg.relative_bias_lr_multiplier != 1.0:  # only then: the optimizer state of other runs is unchanged
        parts.append(optax.masked(optax.scale(cfg.relative_bias_lr_multiplier), relative_bias_mask(params)))
    bounds = param_bounds(params)
    if any(b is not None for b in bounds):  # only then, as above
        parts.append(project_to_bounds(bounds))
    if cfg.ema_decay:  # only then, as above
        parts.append(param_ema(cfg.ema_decay))
    return parts[0] if len(parts) == 1 else optax.chain(*parts)
