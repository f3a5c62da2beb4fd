"""Random positions drawn once per batch, as Ruoss et al.'s code draws them (`random_positions_per_batch`):
every row of a batch reads the draw a batch of one would get from the same key. (That a causal
stack drawing per batch never reads ahead: tests/test_random_position_forms.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from txjax import Bert, BertConfig, ops
from txjax.nn.positions import Positions
from txjax.train.steps import fresh_rngs

TINY = dict(vocab_size=13, max_len=32, d_model=16, num_heads=2, num_layers=3, d_ff=32)
LENGTHS = np.array([7, 3, 7, 1, 5])


def split(m):
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    return lambda key: nnx.merge(graphdef, params, fresh_rngs(rest, key))  # as the train step does


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("draw", [ops.random_positions, ops.random_distances])
def test_each_row_is_the_draw_of_a_batch_of_one(draw, jit):
    """shared: row b equals the one-row draw of its own length from the same key, so rows of equal
    length are equal and a padded row is still drawn as if alone."""
    fn = jax.jit(draw, static_argnums=(1, 2, 3), static_argnames="shared") if jit else draw
    for seed in range(4):
        key = jax.random.key(seed)
        full = np.asarray(fn(key, 5, 7, 40, shared=True))
        np.testing.assert_array_equal(full, np.broadcast_to(fn(key, 1, 7, 40), (5, 7)))
        padded = np.asarray(fn(key, 5, 7, 40, jnp.asarray(LENGTHS), shared=True))
        for b, n in enumerate(LENGTHS):
            np.testing.assert_array_equal(padded[b], fn(key, 1, 7, 40, jnp.asarray([n]))[0])
    unshared = np.asarray(fn(jax.random.key(0), 5, 7, 40))
    assert len({tuple(r) for r in unshared}) == 5  # per row, the rows differ


def test_a_shared_draw_is_uniform_over_subsets():
    """Over batches, each position of [0, R) is in a row's shared draw with probability T / R."""
    p = np.stack([np.asarray(ops.random_positions(jax.random.key(s), 3, 4, 8, shared=True))[0]
                  for s in range(2000)])
    np.testing.assert_allclose(np.bincount(p.ravel(), minlength=8) / 2000, 4 / 8, atol=0.04)


@pytest.mark.parametrize("position, form", [("rope", "positions"), ("alibi", "distances"), ("rope", "layers"),
                                            ("t5", "layers"), ("kerple", "layer_distances")])
def test_every_row_of_a_batch_reads_one_draw_in_every_form(position, form, monkeypatch):
    drawn = []
    for name in ("distances", "layer_positions"):
        original = getattr(Positions, name)

        def spy(self, *args, _original=original):
            out = _original(self, *args)
            if out is not None:
                drawn.append(np.asarray(out))
            return out

        monkeypatch.setattr(Positions, name, spy)
    config = dict(TINY, position=position, random_positions=24, random_positions_form=form)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 13, (4, 6)), jnp.int32)
    shared = split(Bert(BertConfig(**config, random_positions_per_batch=True), rngs=nnx.Rngs(0)))
    model = shared(jax.random.key(1))
    if form == "positions":
        drawn.append(np.asarray(model.positions(tokens)))
    assert np.isfinite(np.asarray(model(tokens))).all()
    assert len(drawn) == {"positions": 1, "distances": 1, "layers": 3, "layer_distances": 3}[form]
    for d in drawn:
        assert d.shape == (4, 6) and np.all(np.diff(d, axis=1) > 0)
        assert (d == d[:1]).all()  # one draw for the batch
    if form in ("layers", "layer_distances"):
        assert len({d.tobytes() for d in drawn}) == 3  # still one per layer
    drawn.clear()
    per_row = split(Bert(BertConfig(**config), rngs=nnx.Rngs(0)))(jax.random.key(1))
    if form == "positions":
        drawn.append(np.asarray(per_row.positions(tokens)))
    per_row(tokens)
    assert all(len({tuple(r) for r in d}) == 4 for d in drawn)


def test_the_flag_is_validated():
    with pytest.raises(ValueError, match="random_positions_per_batch must be a bool"):
        BertConfig(**TINY, random_positions=24, random_positions_per_batch="yes")
