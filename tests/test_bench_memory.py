"""bench.train_step_memory: XLA's compiled plan of the real train step against txjax.cost."""

import pytest

from txjax import bench, cost
from txjax.config import GPTConfig


@pytest.mark.slow  # two train-step compilations
def test_train_step_memory_grows_with_length_and_holds_the_state():
    config = GPTConfig(vocab_size=11, max_len=64, d_model=16, num_heads=2, num_layers=1, d_ff=32)
    short, long = bench.train_step_memory(config, 2, 16), bench.train_step_memory(config, 2, 64)
    state = cost.param_count(config) * (4 + 4 + 4)  # float32 weights, AdamW m and v
    for plan in (short, long):
        assert plan["arguments"] >= state  # plus the batch and the step count
        assert plan["aliased"] >= 0.9 * state  # the donated state is reused for the output
        assert plan["peak"] == plan["arguments"] + plan["outputs"] - plan["aliased"] + plan["temporaries"]
    assert long["temporaries"] > 2 * short["temporaries"]
    # Within a factor 2 of the analytic prediction at both lengths.
    for t, plan in ((16, short), (64, long)):
        predicted = cost.train_step_bytes(config, 2, t)["total"]
        assert 0.5 < plan["peak"] / predicted < 2.0, (t, plan, predicted)
