"""A resumed state is refused when its weights hold a NaN or inf, naming the leaf (issue 60): every update of the
run would be skipped."""

import types

import jax.numpy as jnp
import pytest

from mathrl_jax.errors import TrainingError
from mathrl_jax.train.setup import _build as build


def test_a_restored_state_with_a_non_finite_weight_is_refused_naming_the_leaf():
    params = {"layers": {"0": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}}, "step": jnp.int32(3)}
    build.check_finite_state(types.SimpleNamespace(params=params, critic_params=None), "ckpt/4")  # finite
    bad = {**params, "layers": {"0": {**params["layers"]["0"], "bias": jnp.array([0.0, jnp.nan, 0.0])}}}
    named = r"checkpoint ckpt/4 holds non-finite weights \(NaN or inf\) in params/layers/0/bias:"
    with pytest.raises(TrainingError, match=named):
        build.check_finite_state(types.SimpleNamespace(params=bad, critic_params=None), "ckpt/4")
    critic = {"head": jnp.array([jnp.inf], jnp.bfloat16)}
    with pytest.raises(TrainingError, match="in critic_params/head"):
        build.check_finite_state(types.SimpleNamespace(params=params, critic_params=critic), "ckpt/4")
