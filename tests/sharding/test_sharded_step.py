"""A forward pass and an optimizer step of a tiny Qwen on 8 simulated devices, for several
meshes, against the same step on one device; every leaf's sharding is its rule's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from mathrl_jax import sharding as S
from mathrl_jax.models import QwenForCausalLM, forward, hf, tiny_config
from mathrl_jax.models.hf_config import load_config
from mathrl_jax.sharding.rules import path_string

MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
CONFIG = tiny_config(num_hidden_layers=2)  # 4 heads, 2 kv heads: tp=4 replicates k/v
# Adam's first step is lr * g / (|g| + eps): with a tiny eps it is lr * sign(g), which
# float-rounding noise flips for gradients near 0. eps = 1e-3 keeps the comparison with
# one device well conditioned while still exercising the sharded mu / nu state.
OPTIMIZER = optax.adamw(1e-2, eps=1e-3)


def init_state():
    return nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))[1]


GRAPHDEF = nnx.graphdef(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))


def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(0, CONFIG.vocab_size, (8, 16)).astype(np.int32)
    mask = np.ones((8, 16), np.int32)
    mask[3, 10:] = 0
    mask[5, :4] = 0
    return ids, mask


def loss_fn(state, ids, mask):
    logits, _ = forward(GRAPHDEF, state, ids, attention_mask=mask)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), ids[:, 1:, None], -1)[..., 0]
    weights = (mask[:, 1:] * mask[:, :-1]).astype(jnp.float32)
    return -jnp.sum(logp * weights) / jnp.sum(weights)


def train_step(state, opt_state, ids, mask):
    loss, grads = jax.value_and_grad(loss_fn)(state, ids, mask)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, state)
    return loss, optax.apply_updates(state, updates), opt_state


@functools.lru_cache(maxsize=None)
def single_device_result():
    state = init_state()
    ids, mask = batch()
    loss, new_state, _ = jax.jit(train_step)(state, OPTIMIZER.init(state), ids, mask)
    logits, _ = jax.jit(functools.partial(forward, GRAPHDEF))(state, ids, attention_mask=mask)
    return float(loss), jax.device_get(new_state), np.asarray(logits)


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "dp{}-fsdp{}-tp{}".format(*s))
def test_sharded_forward_and_step_match_one_device(shape):
    mesh = S.make_mesh(dict(zip(S.AXES, shape)), num_attention_heads=CONFIG.num_attention_heads)
    rules = S.qwen_rules(CONFIG.num_key_value_heads, mesh.shape["tp"])
    state = S.sharded_init(init_state, mesh, rules)
    opt_shardings = S.tree_shardings(jax.eval_shape(OPTIMIZER.init, state), mesh, rules)
    opt_state = jax.jit(OPTIMIZER.init, out_shardings=opt_shardings)(state)
    ids, mask = batch()
    batch_sharding = NamedSharding(mesh, S.batch_spec(2))
    ids, mask = jax.device_put(ids, batch_sharding), jax.device_put(mask, batch_sharding)

    with jax.set_mesh(mesh):
        logits, _ = jax.jit(functools.partial(forward, GRAPHDEF))(state, ids, attention_mask=mask)
        loss, new_state, new_opt_state = jax.jit(train_step, donate_argnums=(0, 1))(state, opt_state, ids, mask)

    ref_loss, ref_state, ref_logits = single_device_result()
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=2e-5)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    for (path, got), (_, want) in zip(
        jax.tree_util.tree_flatten_with_path(new_state)[0], jax.tree_util.tree_flatten_with_path(ref_state)[0]
    ):
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, err_msg=path_string(path))

    # Every parameter and optimizer-state leaf lives where its rule says.
    for tree in (new_state, new_opt_state):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            expected = S.spec_for(path_string(path), leaf.shape, rules, mesh)
            assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, expected), leaf.ndim), path_string(path)
    q_kernel = new_state["model"]["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    dp, fsdp, tp = shape
    assert q_kernel.addressable_shards[0].data.shape == (CONFIG.hidden_size // fsdp, CONFIG.hidden_size // tp)


def test_a_leaf_without_a_rule_is_an_error():
    mesh = S.make_mesh({"dp": 1, "fsdp": 8, "tp": 1})
    tree = {"model": {"new_module": {"kernel": jnp.zeros((8, 8))}}}
    with pytest.raises(S.ShardingRuleError, match="no partition rule matches 'model/new_module/kernel'"):
        S.tree_shardings(tree, mesh, S.qwen_rules())


def test_a_rule_that_does_not_divide_the_shape_is_an_error():
    mesh = S.make_mesh({"dp": 1, "fsdp": 8, "tp": 1})
    tree = {"lm_head": {"kernel": jnp.zeros((12, 16))}}
    with pytest.raises(S.ShardingRuleError, match=r"lm_head/kernel of shape \(12, 16\).*12 is not divisible.*fsdp"):
        S.tree_shardings(tree, mesh, S.qwen_rules())


def test_hf_checkpoint_loads_straight_into_the_rule_shardings(tmp_path):
    """Each device reads its own slice from the memory map; the loaded arrays carry the rule shardings."""
    directory = str(tmp_path / "tiny")
    from mathrl_jax.models import write_tiny_checkpoint

    write_tiny_checkpoint(directory, num_hidden_layers=2)
    mesh = S.make_mesh({"dp": 1, "fsdp": 2, "tp": 4})
    rules = S.qwen_rules(CONFIG.num_key_value_heads, 4)
    config = load_config(directory)
    state = hf.load_state(directory, config, S.loader_sharding_fn(mesh, rules))
    reference = nnx.state(hf.load_model(directory))
    for (path, got), (_, want) in zip(nnx.to_flat_state(state), nnx.to_flat_state(reference)):
        array = got[...]
        spec = S.spec_for("/".join(map(str, path)), array.shape, rules, mesh)
        assert array.sharding == NamedSharding(mesh, spec)
        np.testing.assert_array_equal(array, want[...])
        # No device holds the whole tensor unless the rule replicates it.
        if any(axis is not None for axis in spec):
            assert all(s.data.size < array.size for s in array.addressable_shards)


def test_activation_constraints_split_batch_and_heads_under_a_mesh():
    P = jax.sharding.PartitionSpec
    mesh = S.make_mesh({"dp": 2, "fsdp": 2, "tp": 2})
    heads = jnp.ones((8, 4, 4, 16))
    assert S.constrain_heads(heads) is heads  # no active mesh: untouched
    with jax.set_mesh(mesh):
        placed = jax.jit(S.constrain_heads)(heads)
        hidden = jax.jit(S.constrain_batch)(jnp.ones((8, 4, 32)))
        odd_heads = jax.jit(S.constrain_heads)(jnp.ones((8, 4, 3, 16)))  # 3 heads do not split over tp=2
    assert placed.sharding.is_equivalent_to(NamedSharding(mesh, P(("dp", "fsdp"), None, "tp", None)), 4)
    assert hidden.sharding.is_equivalent_to(NamedSharding(mesh, P(("dp", "fsdp"), None, None)), 3)
    assert odd_heads.shape == (8, 4, 3, 16)


def test_the_update_returns_the_state_on_its_rule_shardings_and_compiles_once():
    """Under fsdp, XLA would return the norm weights (and their Adam moments) sharded over fsdp where their rule
    replicates them; the next call would then compile the whole update again."""
    from mathrl_jax.train.state import create_train_state, make_optimizer, place_state
    from mathrl_jax.train.update._passes import compute_logprobs_fn
    from mathrl_jax.train.update._step import UpdateConfig, make_update_fn

    graphdef, params = nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))
    mesh = S.make_mesh({"dp": 1, "fsdp": 8, "tp": 1}, num_attention_heads=CONFIG.num_attention_heads)
    rules = S.qwen_rules(CONFIG.num_key_value_heads, tp=1)
    optimizer = make_optimizer(1e-3)
    state = place_state(create_train_state(params, optimizer, seed=0), mesh, rules)
    shardings = jax.tree.map(lambda leaf: leaf.sharding, state)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(3, CONFIG.vocab_size, (8, 12)), jnp.int32)
    attention = jnp.ones((8, 12), jnp.int32)
    response = jnp.zeros((8, 12)).at[:, 6:].set(1.0)
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": response,
        "old_logprobs": compute_logprobs_fn(graphdef)(params, ids, attention) * response,
        "advantages": jnp.asarray(rng.normal(size=(8, 1)), jnp.float32) * response,
    }
    update = make_update_fn(
        graphdef, optimizer, UpdateConfig(num_mini_batch=2), donate=False, state_shardings=shardings
    )
    with jax.set_mesh(mesh):
        for _ in range(3):
            state, _ = update(state, batch)
    for (path, leaf), want in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree_util.tree_leaves(shardings)):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), (jax.tree_util.keystr(path), leaf.sharding, want)
    assert update._cache_size() == 1


@pytest.mark.parametrize("minibatches, max_rows", [(2, None), (1, 4)], ids=["one-micro-batch", "token-budget"])
def test_a_packed_update_on_a_mesh_equals_it_on_one_device(minibatches, max_rows):
    """Packed micro-batches (rows a multiple of dp x fsdp) on 8 devices: the same step as one device's, with one
    micro-batch per minibatch and with token-budget micro-batches (skipped when empty, under `lax.cond`)."""
    from mathrl_jax.train.state import create_train_state, place_state
    from mathrl_jax.train.update._minibatches import with_packing
    from mathrl_jax.train.update._passes import compute_logprobs_fn
    from mathrl_jax.train.update._step import UpdateConfig, make_update_fn

    graphdef, params = nnx.split(QwenForCausalLM(CONFIG, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(1)
    columns = np.arange(16)
    prompts, responses = rng.integers(1, 7, 8), rng.integers(1, 11, 8)
    attention = ((columns >= 6 - prompts[:, None]) & (columns < 6 + responses[:, None])).astype(np.int32)
    response = ((columns >= 6) & (columns < 6 + responses[:, None])).astype(np.float32)
    ids = jnp.asarray(rng.integers(3, CONFIG.vocab_size, (8, 16)) * attention, jnp.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": jnp.asarray(attention),
        "response_mask": jnp.asarray(response),
        "old_logprobs": compute_logprobs_fn(graphdef)(params, ids, jnp.asarray(attention)) * response,
        "advantages": jnp.asarray(rng.normal(size=(8, 1)) * response, jnp.float32),
    }
    cfg = UpdateConfig(num_mini_batch=minibatches, kl_coef=0.0)
    results = []
    for shape in [None, (2, 2, 2)]:
        state = create_train_state(params, OPTIMIZER, seed=0)
        mesh = None
        if shape is not None:
            mesh = S.make_mesh(dict(zip(("dp", "fsdp", "tp"), shape)), num_attention_heads=CONFIG.num_attention_heads)
            state = place_state(state, mesh, S.qwen_rules(CONFIG.num_key_value_heads, tp=shape[2]))
        packed = with_packing(
            batch,
            state.rng,
            ppo_epoch=1,
            num_mini_batch=minibatches,
            row_tokens=16,
            max_rows_per_micro=max_rows,
            rows_multiple=4,
        )
        assert packed["packed"]["source"].shape[2] % 4 == 0
        assert packed["packed"]["source"].shape[1] > 1 or max_rows is None  # several micro-batches
        update = make_update_fn(graphdef, OPTIMIZER, cfg, donate=False)
        if mesh is None:
            results.append(jax.device_get(update(state, packed)))
        else:
            with jax.set_mesh(mesh):
                results.append(jax.device_get(update(state, packed)))
    (one, one_metrics), (many, many_metrics) = results
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(many.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(one_metrics["loss"], many_metrics["loss"], rtol=1e-4, atol=1e-6)
