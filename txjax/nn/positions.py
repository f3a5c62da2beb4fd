"""Position modules: what a stack adds to its input or to its attention logits for each `position`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from txjax import ops
from txjax.config import ROTARY_POSITIONS, TransformerConfig
from txjax.nn.layers import INIT, is_concrete
from txjax.nn.random_positions import RandomDistances, RandomPositions


class Rotary(struct.PyTreeNode):
    """What rotates queries and keys (rope, scaled rope, xpos): static settings, no arrays.

    Both are rotated at their own positions, [T] or [B, T]; keys are rotated before they
    are cached, so a cached key is the one the full forward computes.
    """

    kind: str = struct.field(pytree_node=False)
    base: float = struct.field(pytree_node=False)
    scaling: str | None = struct.field(pytree_node=False)
    factor: float = struct.field(pytree_node=False)
    original_max_len: int = struct.field(pytree_node=False)
    xpos_scale_base: float = struct.field(pytree_node=False)

    @classmethod
    def of(cls, config: TransformerConfig) -> "Rotary | None":
        """The config's rotation; None for a position that does not rotate."""
        if config.position not in ROTARY_POSITIONS:
            return None
        original = config.max_len if config.rope_original_max_len is None else config.rope_original_max_len
        return cls(config.position, config.rope_base, config.rope_scaling, config.rope_scaling_factor,
                   original, config.xpos_scale_base)

    def _apply(self, x_BTNH: jax.Array, positions: jax.Array, downscale: bool) -> jax.Array:
        scaling = (self.scaling, self.factor, self.original_max_len)
        if self.kind == "xpos":
            return ops.apply_xpos(x_BTNH, positions, self.base, self.xpos_scale_base, downscale, *scaling)
        return ops.apply_rope(x_BTNH, positions, self.base, *scaling)

    def queries(self, q_BTNH: jax.Array, positions: jax.Array) -> jax.Array:
        return self._apply(q_BTNH, positions, downscale=False)

    def keys(self, k_BSNH: jax.Array, positions: jax.Array) -> jax.Array:
        return self._apply(k_BSNH, positions, downscale=True)


class RelativePositionBias(nnx.Module):
    """T5's learned scalar per (bucket, head), added to attention logits."""

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional = bidirectional
        self.num_buckets = config.num_buckets
        self.max_distance = config.max_distance
        self.table = nnx.Param(INIT(rngs.params(), (config.num_buckets, config.num_heads)))

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array,
                 distances_BR: jax.Array | None = None) -> jax.Array:
        """[1, N, T, S] from [T] and [S] positions; [B, N, T, S] from per-row ones or random
        distances (`ops.random_offsets`)."""
        offset_BTS = ops.random_offsets(ops.relative_positions(q_positions, k_positions), distances_BR)
        bucket_BTS = ops.t5_relative_position_bucket(offset_BTS, self.bidirectional, self.num_buckets,
                                                     self.max_distance)
        return jnp.transpose(self.table[...][bucket_BTS], (0, 3, 1, 2))


def _uniform(key: jax.Array, shape: tuple[int, ...], low: float, high: float) -> jax.Array:
    return jax.random.uniform(key, shape, jnp.float32, low, high)


def _clamp_straight_through(x: jax.Array, low: float, high: float | None) -> jax.Array:
    """x clipped to [low, high] in value, with the gradient of x itself."""
    return jax.lax.stop_gradient(jnp.clip(x, low, high)) + (x - jax.lax.stop_gradient(x))  # x - x: exactly 0


class FireBias(nnx.Module):
    """FIRE's MLP, log scale c and threshold L (Li et al. 2023), one per stack.

    Initialised as the paper's reference code: PyTorch `nn.Linear` defaults
    (U(+-1/sqrt(fan_in)) for weights and biases), c = fire_c = 0.1 learned (a constant with
    `fire_learn_c=False`), and L = |m| * fire_threshold with the multiplier m = 1 learned (a
    constant m = 1 with `fire_learn_threshold=False`). `fire_mlp_width=0` makes f linear, 1 -> N
    (a control: one weight and bias per head, no hidden layer).
    """

    def __init__(self, config: TransformerConfig, *, directional: bool = False, rngs: nnx.Rngs):
        w, n = config.fire_mlp_width, config.num_heads
        if w:
            self.w1 = nnx.Param(_uniform(rngs.params(), (1, w), -1.0, 1.0))
            self.b1 = nnx.Param(_uniform(rngs.params(), (w,), -1.0, 1.0))
        else:  # f linear, 1 -> N: no hidden layer
            self.w1 = self.b1 = None
        fan_in = w or 1
        self.w2 = nnx.Param(_uniform(rngs.params(), (fan_in, n), -fan_in ** -0.5, fan_in ** -0.5))
        self.b2 = nnx.Param(_uniform(rngs.params(), (n,), -fan_in ** -0.5, fan_in ** -0.5))
        self.c = nnx.Param(jnp.asarray(config.fire_c, jnp.float32)) if config.fire_learn_c else None
        self.init_c = float(config.fire_c)
        self.threshold_multiplier = (nnx.Param(jnp.asarray(1.0, jnp.float32)) if config.fire_learn_threshold
                                     else None)
        self.init_threshold = float(config.fire_threshold)
        self.directional = directional

    @property
    def threshold(self) -> jax.Array:
        """The threshold L = |m| * fire_threshold (fire_threshold itself when m is not learned)."""
        if self.threshold_multiplier is None:
            return jnp.asarray(self.init_threshold, jnp.float32)
        return jnp.abs(self.threshold_multiplier[...]) * self.init_threshold

    @property
    def scale(self) -> jax.Array:
        """The scale |c| of psi(x) = log(|c| x + 1) (fire_c itself when c is not learned)."""
        return jnp.abs(jnp.asarray(self.init_c, jnp.float32) if self.c is None else self.c[...])

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array, distances_BR: None = None) -> jax.Array:
        """[1 or B, N, T, S]. No random distances: the normaliser reads the query's position, not an offset."""
        if distances_BR is not None:
            raise ValueError("FIRE takes no random distance per offset: its normaliser reads the query's position")
        hidden = (None, None) if self.w1 is None else (self.w1[...], self.b1[...])
        return ops.fire_bias(q_positions, k_positions, *hidden, self.w2[...], self.b2[...], self.scale,
                             self.threshold, directional=self.directional)


class KerpleBias(nnx.Module):
    """KERPLE's per-head r1, r2 > 0 (Chi et al. 2022), one pair per head and stack.

    `kerple_positive="softplus"` keeps them positive by a parameterisation: r1 = softplus(raw1)
    and r2 = softplus(raw2), or for the power variant r2 = 2 sigmoid(raw2) in (0, 2).
    `"clamp"` is the reference code's: r1 and r2 are the parameters, kept >= 0.01 (power r2 in
    [0.01, 2]). That code clamps them in place before each forward, so their gradient is never
    cut and a parameter pushed below the floor restarts from it. Here they are `bounds` metadata,
    which the optimizer projects each step's parameters into (`txjax.train.optim.project_to_bounds`),
    and clamped in value where used, gradient passed straight through (for values set outside the
    bounds another way). Adam then moves r2 by ~lr a step, where softplus moves it by
    ~lr * sigmoid(raw2), slower as r2 shrinks.
    Initialised as that code: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 ~ U(0, 1), r2 ~ U(0, 2);
    each drawn value clipped to [0.01, max - 0.01] so the inverse maps stay finite, then r2
    multiplied by `kerple_r2_init_scale` (1: the reference). `kerple_learn_r2=False` keeps r2 at
    that draw (a control: the bias's shape fixed, its scale r1 learned): r2 stays a parameter, so
    it is drawn per seed with the others, but gets no gradient, and AdamW (which does not decay
    it) leaves it where it is. `directional`: r1 and r2 are [2, N], row 0 for keys at or before
    the query, row 1 for keys after it.
    """

    EPS = 1e-2

    def __init__(self, config: TransformerConfig, *, directional: bool = False, rngs: nnx.Rngs):
        self.variant = config.kerple_variant
        self.clamped = config.kerple_positive == "clamp"
        shape = (2, config.num_heads) if directional else (config.num_heads,)
        r1_max, r2_max = (2.0, 1.0) if self.variant == "log" else (1.0, 2.0)
        r1 = jnp.clip(_uniform(rngs.params(), shape, 0.0, r1_max), self.EPS, r1_max - self.EPS)
        r2 = jnp.clip(_uniform(rngs.params(), shape, 0.0, r2_max), self.EPS, r2_max - self.EPS)
        r2 = r2 * config.kerple_r2_init_scale
        self.learn_r2 = config.kerple_learn_r2
        if self.clamped:
            self.raw_r1 = nnx.Param(r1, bounds=(self.EPS, None))
            self.raw_r2 = nnx.Param(r2, bounds=(self.EPS, None if self.variant == "log" else 2.0))
        else:  # the raw values whose softplus (power r2: 2 sigmoid) are r1, r2 (r2 held fixed: r2 itself)
            r1 = r1 + jnp.log(-jnp.expm1(-r1))
            if self.learn_r2:
                r2 = r2 + jnp.log(-jnp.expm1(-r2)) if self.variant == "log" else jnp.log(r2 / 2) - jnp.log1p(-r2 / 2)
            self.raw_r1, self.raw_r2 = nnx.Param(r1), nnx.Param(r2)

    @property
    def r1(self) -> jax.Array:
        if self.clamped:
            return _clamp_straight_through(self.raw_r1[...], *self.raw_r1.bounds)
        return jax.nn.softplus(self.raw_r1[...])

    @property
    def r2(self) -> jax.Array:
        if self.clamped:
            r2 = _clamp_straight_through(self.raw_r2[...], *self.raw_r2.bounds)
        elif not self.learn_r2:  # softplus form, r2 held fixed: the parameter is the draw itself
            r2 = self.raw_r2[...]
        elif self.variant == "log":
            r2 = jax.nn.softplus(self.raw_r2[...])
        else:
            r2 = 2.0 * jax.nn.sigmoid(self.raw_r2[...])
        return r2 if self.learn_r2 else jax.lax.stop_gradient(r2)  # held fixed: gradient 0, so Adam never moves it

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array,
                 distances_BR: jax.Array | None = None) -> jax.Array:
        """[1 or B, N, T, S]."""
        return ops.kerple_bias(q_positions, k_positions, self.r1, self.r2, self.variant, distances_BR)


class Positions(nnx.Module):
    """Everything a stack needs to know about position, for any `config.position`.

    learned / sinusoidal: `embed` gives a [T, D] table added to the input.
    t5 / alibi / fire / kerple: `attention_bias` gives a [1, N, T, S] bias for self-attention.
    rope / xpos: `rotary` rotates the attention's queries and keys. none: nothing at all.
    """

    def __init__(self, config: TransformerConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.kind = config.position
        self.max_len = config.max_len
        self.d_model = config.d_model
        self.num_heads = config.num_heads
        self.rotary = Rotary.of(config)
        self.directional = config.directional_bias and bidirectional  # a causal stack sees no key after the query
        self.table = (
            nnx.Param(nnx.initializers.normal(config.position_init_std)(
                rngs.params(), (config.max_len, config.d_model)))
            if self.kind == "learned" else None
        )
        if self.kind == "t5":
            self.relative = RelativePositionBias(config, bidirectional=bidirectional, rngs=rngs)
        elif self.kind == "fire":
            self.relative = FireBias(config, directional=self.directional, rngs=rngs)
        elif self.kind == "kerple":
            self.relative = KerpleBias(config, directional=self.directional, rngs=rngs)
        else:
            self.relative = None
        form = None if config.random_positions is None else config.random_positions_form
        self.random_distances = RandomDistances.of(config, rngs) if form in ("distances", "layer_distances") else None
        self.random_layer_positions = RandomPositions.of(config, rngs) if form == "layers" else None
        self.draws_per_layer = form in ("layers", "layer_distances")  # each attention layer its own draw

    def embed(self, positions_T: jax.Array) -> jax.Array | None:
        if self.kind == "sinusoidal":
            return ops.sinusoidal_positions(positions_T, self.d_model)
        if self.kind != "learned":
            return None
        if positions_T.shape[-1] > self.max_len:
            raise ValueError(
                f"sequence length {positions_T.shape[-1]} exceeds max_len={self.max_len} "
                "of the learned position table"
            )
        if is_concrete(positions_T) and positions_T.size:
            last = int(np.max(np.asarray(positions_T)))
            if last >= self.max_len:
                raise ValueError(f"position {last} is beyond the learned table (max_len={self.max_len})")
        return jnp.take(self.table[...], positions_T, axis=0, mode="fill", fill_value=jnp.nan)

    def attention_bias(self, q_positions: jax.Array, k_positions: jax.Array,
                       distances_BR: jax.Array | None = None) -> jax.Array | None:
        """distances_BR: the random distance per offset (`distances`: ALiBi, T5's bias, KERPLE);
        None: the offset itself."""
        if self.relative is not None:
            return self.relative(q_positions, k_positions, distances_BR)
        if self.kind == "alibi":
            return ops.alibi_bias(self.num_heads, q_positions, k_positions, self.directional, distances_BR)
        return None

    def distances(self, batch: int, length: int, valid_BT: jax.Array | None = None) -> jax.Array | None:
        """Random distances per offset ([B, T]; the `distances` forms), or None when there are none to draw."""
        return None if self.random_distances is None else self.random_distances(batch, length, valid_BT)

    def layer_positions(self, batch: int, length: int, valid_BT: jax.Array | None = None) -> jax.Array | None:
        """One attention layer's random positions ([B, T]; the `layers` form), or None."""
        return None if self.random_layer_positions is None else self.random_layer_positions(batch, length, valid_BT)
