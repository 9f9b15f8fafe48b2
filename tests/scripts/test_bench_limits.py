"""benchmarks/limits.py: the FLOP counts against XLA's own count of the real Qwen model's programs, the byte counts
against the model's parameter and KV-cache arrays, the decode bytes against a step-by-step cache, and the measured
limits and the GRPO limits table at small sizes (no timings asserted)."""

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks import grpo, limits
from mathrl_jax.models import QwenForCausalLM, forward, init_cache, tiny_config, write_tiny_checkpoint

# Matmuls dominate: hidden 256, 2 layers, a 4096-token vocabulary, 1 x 256 tokens.
SHAPE = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
    tie_word_embeddings=False,
)
LENGTH = 256


def xla_flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]


def split_model(**overrides):
    return nnx.split(QwenForCausalLM(tiny_config(**{**SHAPE, **overrides}), rngs=nnx.Rngs(0)))


def counted(config, lengths):
    return limits.matmul_params(config), lengths, config.num_hidden_layers, limits.attention_width(config)


def test_matmul_params_are_the_models_matmul_weights():
    """N counts every kernel (and a tied embedding once, as the output projection) of the real model."""
    for tied in (False, True):
        graphdef, params = split_model(tie_word_embeddings=tied)
        flat = nnx.to_flat_state(params)
        kernels = sum(v[...].size for path, v in flat if path[-1] == "kernel")
        embedding = sum(v[...].size for path, v in flat if path[-1] == "embedding")
        config = nnx.merge(graphdef, params).config
        assert limits.matmul_params(config) == kernels + (embedding if tied else 0)


def test_forward_flops_are_xlas_count_of_the_model():
    """2 N T + 4 L W T^2 within 2% of XLA's count of the forward (its softmax and norms included), with the dense
    attention the PaLM convention counts; the CPU's blocked causal attention skips key blocks: its count lies
    between the convention's and an exactly causal one's (T (T + 1) / 2 keys per sequence)."""
    ids = jnp.arange(LENGTH, dtype=jnp.int32)[None] % SHAPE["vocab_size"]
    graphdef, params = split_model(attention="xla")
    config = nnx.merge(graphdef, params).config
    formula = limits.logprob_flops(*counted(config, [LENGTH]))
    xla = xla_flops(lambda p, i: forward(graphdef, p, i)[0], params, ids)
    assert abs(xla / formula - 1) < 0.02

    graphdef, params = split_model(attention="blocked")
    blocked = xla_flops(lambda p, i: forward(graphdef, p, i)[0], params, ids)
    causal = formula - 4 * config.num_hidden_layers * limits.attention_width(config) * LENGTH * (LENGTH - 1) / 2
    assert causal < blocked < formula


def test_update_flops_are_xlas_count_of_the_gradient():
    """6 N T + 12 L W T^2 (3 forwards) within 3% of XLA's count of the gradient program (forward and backward)."""
    ids = jnp.arange(LENGTH, dtype=jnp.int32)[None] % SHAPE["vocab_size"]
    graphdef, params = split_model(attention="xla")
    config = nnx.merge(graphdef, params).config

    def loss(p, i):
        logp = jax.nn.log_softmax(forward(graphdef, p, i)[0][:, :-1])
        return jnp.take_along_axis(logp, i[:, 1:, None], axis=-1).mean()

    xla = xla_flops(jax.grad(loss), params, ids)
    assert abs(xla / limits.update_flops(*counted(config, [LENGTH])) - 1) < 0.03


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "overrides",
    [
        dict(tie_word_embeddings=False),
        dict(tie_word_embeddings=True),
        dict(architecture="Qwen3ForCausalLM", qk_norm=True, attention_bias=False),
    ],
    ids=["untied", "tied", "qwen3"],
)
def test_weight_and_cache_bytes_are_the_arrays(overrides, dtype):
    """The weights a step reads are every parameter array (in the compute dtype) but an untied embedding table;
    a row's cache per position is init_cache's bytes over its rows and positions."""
    config = tiny_config(**{**SHAPE, **overrides, "param_dtype": dtype, "dtype": dtype})
    params = nnx.state(QwenForCausalLM(config, rngs=nnx.Rngs(0)), nnx.Param)
    flat = nnx.to_flat_state(params)
    table = sum(v[...].nbytes for path, v in flat if path[-1] == "embedding")
    total = sum(v[...].nbytes for _, v in flat)
    assert limits.weight_bytes(config, dtype) == total - (0 if config.tie_word_embeddings else table)
    batch, positions = 3, 40
    cache = init_cache(config, batch, positions)
    assert limits.kv_bytes_per_position(config, dtype) * batch * positions == sum(
        x.nbytes for x in jax.tree.leaves(cache)
    )


def test_decode_bytes_are_a_step_by_step_caches_reads():
    """The closed form against a cache filled step by step: the prefill writes each prompt, each decode step writes
    one slot per row and reads every filled one; each forward call reads the weights once. Linear in the prompt
    lengths: their mean gives the same total."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(1, 30, 7)
    weights, per_position, new = 1000, 3, 11
    filled = np.zeros((len(prompts), prompts.max() + new), bool)
    for row, p in enumerate(prompts):
        filled[row, :p] = True
    reads = weights  # the prefill: the weights, the prompt's keys and values computed there, not read from a cache
    for _ in range(new - 1):
        filled[np.arange(len(prompts)), filled.sum(1)] = True
        reads += weights + per_position * filled.sum()
    assert limits.decode_bytes(weights, per_position, prompts, new) == reads
    mean = np.full(len(prompts), prompts.mean())
    assert math.isclose(limits.decode_bytes(weights, per_position, mean, new), reads)


def test_generation_flops_are_the_prefill_and_each_decode_steps_forward():
    """The closed form against the prefill's forward and a step-by-step sum: the step feeding new token s runs
    one position per row against p_r + s cached ones, 2 N + 4 L W (p_r + s)."""
    prompts = np.random.default_rng(1).integers(1, 30, 5)
    params, layers, width, new = 1000, 3, 16, 9
    steps = sum(2 * params + 4 * layers * width * (p + s) for s in range(1, new) for p in prompts)
    want = limits.logprob_flops(params, prompts, layers, width) + steps
    assert math.isclose(limits.generation_flops(params, layers, width, prompts, new), want)
    assert limits.generation_flops(params, layers, width, prompts, 1) == limits.logprob_flops(
        params, prompts, layers, width
    )


def test_the_measured_limits_are_positive_and_their_counts_xlas():
    """Small sizes: positive, finite rates below 10 PFLOP/s and 10 TB/s; the work they divide is XLA's own count
    of the programs (2 n^3 FLOPs; 2 x nbytes read and written)."""
    for dtype in ("float32", "bfloat16"):
        rate = limits.matmul_rate(dtype, size=128, repeats=2)
        assert math.isfinite(rate) and 0 < rate < 1e16
    assert 0 < limits.copy_bandwidth(nbytes=2**20, repeats=2) < 1e13
    a = jnp.ones((128, 128), jnp.float32)
    assert xla_flops(jnp.dot, a, a) == 2 * 128**3
    x = jnp.ones((2**18,), jnp.float32)
    cost = jax.jit(lambda v: v * 2).lower(x).compile().cost_analysis()
    assert (cost[0] if isinstance(cost, (list, tuple)) else cost)["bytes accessed"] == 2 * x.nbytes


def record(response, update_time, generate_time, grade_time, fraction=1.0):
    return {
        "rollout/response_length": response,
        "rollout/response_length_max": response,
        "train/trained_token_fraction": fraction,
        "perf/update_time": update_time,
        "perf/generate_time": generate_time,
        "perf/grade_time": grade_time,
        "perf/logprob_time": 0.001,
    }


def test_stage_fractions_follow_the_times_and_the_rows_trained():
    """Half the update time: twice the update's fraction; half the rows trained: half of it; the grading is
    taken out of the generation's time and the update time leaves it alone."""
    config = tiny_config(**SHAPE)
    counts = limits.model_counts(config, "float32")
    machine = {"matmul_flops": {"float32": 1e11, "bfloat16": 2e11}, "copy_bytes_per_second": 1e10}

    def fractions(*rec):
        stages = limits.stage_fractions([record(*rec)], counts, machine, rows=8, prompt_length=12.0)
        return stages["update"]["flops_per_second"], stages["generation"]["bytes_per_second"]

    update, generation = fractions(20, 2.0, 3.0, 1.0)
    assert math.isclose(fractions(20, 1.0, 3.0, 1.0)[0], 2 * update)
    assert math.isclose(fractions(20, 2.0, 3.0, 1.0, 0.5)[0], update / 2)
    assert math.isclose(fractions(20, 1.0, 2.0, 0.0)[1], generation)
    assert math.isclose(fractions(20, 2.0, 3.0, 2.0)[1], 2 * generation)
    lengths = np.full(8, 12.0 + 20)
    assert math.isclose(update * 2.0, limits.update_flops(*counted(config, lengths)))


def test_grpo_limits_table_on_a_tiny_checkpoint(tmp_path):
    """The limits of a GRPO run (benchmarks/grpo.py's, at a real shape) on a small real checkpoint: the prompt
    length is its tokenizer's, each fraction is its rate over its limit, and every stage is printed."""
    model = str(tmp_path / "model")
    write_tiny_checkpoint(model, seed=0, **{**SHAPE, "vocab_size": 512, "num_hidden_layers": 1})
    args = argparse.Namespace(
        prompts=2, samples=2, max_new_tokens=6, minibatches=1, lr=1e-5, warmstart_steps=0, set=[], iterations=1
    )
    args.warmup = 1
    config = grpo.run_config(model, str(tmp_path), args)
    result = limits.grpo_limits(model, config, [record(5.0, 0.01, 0.02, 0.001)], 64, 2**16, 1)
    assert result["rows"] == 4 and 1 < result["prompt_length"] < 40
    stages = result["stages"]
    assert (stages["logprob"]["rows"], stages["logprob"]["length"]) == (4, round(result["prompt_length"] + 5))
    for stage in stages.values():
        rate = stage.get("flops_per_second", stage.get("bytes_per_second"))
        assert stage["fraction"] == rate / stage["limit"] > 0
    assert stages["update"]["limit"] == result["machine"]["matmul_flops"]["float32"]
    assert json.loads(json.dumps(result)) == result  # the benchmark's JSON holds it as it is
    text = "\n".join(limits.limits_lines(result))
    for stage in ("| update |", "| generation |", "| log-prob pass |"):
        assert stage in text
