"""Checkpointer: exact resume, the save schedule, asynchronous and atomic writes (a real SIGKILL),
sharded save and restore onto other meshes, and the errors for bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mathrl_jax import sharding as S
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from mathrl_jax.train.checkpoint._errors import CheckpointError
from mathrl_jax.train.checkpoint._tree import TargetMismatchError
from tests.train.ckpt_kill_worker import make_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/train: the worker script


def assert_bit_identical(got, want):
    """Same tree, same leaf types and dtypes, same bytes (NaN payloads included)."""
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    assert got_def == want_def
    for (path, a), (_, b) in zip(got_leaves, want_leaves):
        where = jax.tree_util.keystr(path)
        assert type(a) is type(b), (where, type(a), type(b))
        if isinstance(a, (jax.Array, np.ndarray, np.generic)):
            assert a.dtype == b.dtype and np.shape(a) == np.shape(b), where
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), where
        else:
            assert a == b, where


# --------------------------------------------------------------------------------------------
# A tiny but complete training run: params, Adam state, a raw uint32 RNG key, a step counter,
# and the data position in the metadata.
# --------------------------------------------------------------------------------------------

OPTIMIZER = optax.adamw(1e-2)
DATA = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
BATCH = 8


def init_state(seed):
    key = jax.random.key(seed)
    params = {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros((3,), jnp.bfloat16)}
    return {
        "params": params,
        "opt_state": OPTIMIZER.init(params),
        "rng": jax.random.key_data(jax.random.fold_in(key, 1)),
        "step": 0,
        "ema_loss": 0.0,
    }


@jax.jit
def _update(state, x):
    key, noise_key = jax.random.split(jax.random.wrap_key_data(state["rng"]))
    noise = 0.1 * jax.random.normal(noise_key, (x.shape[0], 3))  # the RNG changes the loss

    def loss_fn(params):
        y = x @ params["w"] + params["b"].astype(jnp.float32)
        return jnp.mean((y - noise) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPTIMIZER.update(grads, state["opt_state"], state["params"])
    return optax.apply_updates(state["params"], updates), opt_state, jax.random.key_data(key), loss


def train(state, position, steps):
    """`steps` updates from data `position`; returns (state, next position)."""
    for _ in range(steps):
        x = DATA[position % len(DATA) : position % len(DATA) + BATCH]
        params, opt_state, rng, loss = _update(state, x)
        ema = 0.9 * state["ema_loss"] + 0.1 * float(loss)
        state = {"params": params, "opt_state": opt_state, "rng": rng, "step": state["step"] + 1, "ema_loss": ema}
        position += BATCH
    return state, position


def test_resumed_run_continues_exactly_as_an_uninterrupted_one(tmp_path):
    uninterrupted, end_position = train(init_state(0), 0, 6)

    state, position = train(init_state(0), 0, 3)
    with Checkpointer(str(tmp_path), save_interval=3) as checkpointer:
        assert checkpointer.save(state["step"], state, {"data_position": position, "config": {"lr": 1e-2}})

    # A new process: a fresh Checkpointer, and a target built from another seed.
    with Checkpointer(str(tmp_path), save_interval=3) as checkpointer:
        assert checkpointer.latest_step() == 3
        restored, metadata = checkpointer.restore(init_state(1))
    assert_bit_identical(restored, state)
    assert metadata == {"data_position": 3 * BATCH, "config": {"lr": 1e-2}}
    resumed, resumed_position = train(restored, metadata["data_position"], 3)
    assert resumed_position == end_position
    assert_bit_identical(resumed, uninterrupted)


def test_every_leaf_kind_round_trips_bit_identically(tmp_path):
    state = {
        "f32": jnp.array([1.5, -0.0, np.nan, np.inf], jnp.float32),
        "bf16": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) / 3,
        "i8": jnp.array([-128, 127], jnp.int8),
        "key": jax.random.key_data(jax.random.key(7)),  # uint32 raw key data
        "np_f64": np.linspace(0, 1, 5),
        "np_u8": np.arange(4, dtype=np.uint8),
        "np_scalar": np.float32(0.1),
        "py": {"int": 2**40 + 3, "float": 0.1 + 0.2, "bool": True},
        "tuple": (jnp.ones(2), [np.int64(5)]),
    }
    metadata = {"data": {"epoch": 2, "position": [3, 14]}, "version": "0.1.0", "none": None, "x": 1e-300}
    with Checkpointer(str(tmp_path), save_interval=1, async_save=False) as checkpointer:
        checkpointer.save(5, state, metadata)
        target = jax.tree.map(lambda x: x * 0 if not isinstance(x, bool) else False, state)
        restored, restored_metadata = checkpointer.restore(target)
        assert_bit_identical(restored, state)
        assert restored_metadata == metadata
        assert checkpointer.read_metadata() == metadata
        shapes = checkpointer.saved_shapes(5)
    assert shapes["bf16"] == ((2, 3), np.dtype(jnp.bfloat16)) and shapes["key"] == ((2,), np.dtype(np.uint32))
    assert set(shapes) == {"/".join(map(str, p)) for p in _paths(state)}


def _paths(tree):
    def name(k):
        return k.key if hasattr(k, "key") else k.idx if hasattr(k, "idx") else k.name

    return [tuple(name(k) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


class Net(nnx.Module):
    """A small NNX model with the variable kinds a policy has: nested lists, params and a counter."""

    def __init__(self, rngs):
        self.embed = nnx.Embed(16, 8, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(2)])
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.count = nnx.BatchStat(jnp.array(3, jnp.int32))


def test_nnx_state_restores_into_an_abstract_model_and_a_pure_dict(tmp_path):
    model = Net(nnx.Rngs(0))
    state = nnx.state(model)
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(1, {"params": state, "step": 1}, {})
        abstract = nnx.state(nnx.eval_shape(lambda: Net(nnx.Rngs(1))))
        restored, _ = checkpointer.restore({"params": abstract, "step": 0})
        as_pure, _ = checkpointer.restore({"params": nnx.to_pure_dict(abstract), "step": 0})
        assert "params/layers/1/kernel" in checkpointer.saved_shapes()  # NNX's `.value` is not part of the key
    assert isinstance(restored["params"], nnx.State)
    assert_bit_identical(restored["params"], state)
    assert_bit_identical(as_pure["params"], nnx.to_pure_dict(state))
    fresh = Net(nnx.Rngs(2))
    nnx.update(fresh, restored["params"])  # the restored state drives a model
    x = jnp.arange(4)
    np.testing.assert_array_equal(np.asarray(fresh.norm(fresh.embed(x))), np.asarray(model.norm(model.embed(x))))


class LegacyState(NamedTuple):
    """A TrainState-like pytree: params with a list, a chained optax Adam state, raw key data, Python scalars."""

    params: dict
    opt_state: tuple
    rng: jax.Array
    step: int
    extra: tuple


def _previous_layout(tree):
    """`tree` as the previous Checkpointer stored it: every container a dict keyed by name (list and tuple
    entries keyed "0", "1", ...; NamedTuple and dataclass fields by field name), NumPy scalars as 0-d arrays."""
    root = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        *parents, last = [jax.tree_util.keystr((key,), simple=True) for key in path]
        node = root
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = np.array(leaf) if isinstance(leaf, np.generic) else leaf
    return root


def test_a_checkpoint_of_the_previous_layout_restores_bit_identically_into_the_target(tmp_path):
    """Run directories written before the state was saved as it is (all dicts) stay resumable."""
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    def make(seed):
        key = jax.random.key(seed)
        params = {
            "layers": [{"kernel": jax.random.normal(jax.random.fold_in(key, i), (3, 2))} for i in range(2)],
            "embed": jnp.arange(8, dtype=jnp.bfloat16).reshape(4, 2) / 3,
        }
        opt_state = optimizer.init(params)
        grads = jax.tree.map(lambda p: jnp.sin(p + seed), params)
        _, opt_state = optimizer.update(grads, opt_state, params)  # nonzero Adam moments, count 1
        rng = jax.random.key_data(jax.random.fold_in(key, 9))
        extra = (np.float32(seed + 0.5), [2**40 + seed, seed % 2 == 0, 0.1 * seed])
        return LegacyState(params, opt_state, rng, 7 + seed, extra)

    state, target = make(1), make(2)
    old = _previous_layout(state)
    assert all(
        isinstance(key, jax.tree_util.DictKey)
        for path, _ in jax.tree_util.tree_flatten_with_path(old)[0]
        for key in path
    )
    # Tuple entries and Adam's fields by name; the clip's EmptyState, without leaves, is not stored.
    assert list(old["opt_state"]) == ["1"] and list(old["opt_state"]["1"]["0"]) == ["count", "mu", "nu"]
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(3, old, {"data_position": 24})
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        shapes = checkpointer.saved_shapes()
        restored, metadata = checkpointer.restore(target)
    assert metadata == {"data_position": 24}
    assert_bit_identical(restored, state)  # the target's structure: NamedTuples, tuples, lists, Python scalars
    assert isinstance(restored.opt_state[1][0], optax.ScaleByAdamState) and int(restored.opt_state[1][0].count) == 1
    assert set(shapes) == {"/".join(map(str, p)) for p in _paths(state)}
    assert shapes["rng"] == ((2,), np.dtype(np.uint32))


# --------------------------------------------------------------------------------------------
# Schedule and retention
# --------------------------------------------------------------------------------------------


def test_saves_every_interval_and_at_the_end_keeping_the_last_n(tmp_path):
    interval, keep, last = 3, 2, 10
    with Checkpointer(str(tmp_path), save_interval=interval, max_to_keep=keep) as checkpointer:
        saved = []
        for step in range(last + 1):
            if checkpointer.save(step, {"x": jnp.full((2,), step)}, {"step": step}):
                saved.append(step)
        assert checkpointer.save(last, {"x": jnp.full((2,), last)}, {"step": last}, force=True)
        saved.append(last)
        assert not checkpointer.save(last, {"x": jnp.zeros(2)}, {}, force=True)  # never overwritten
        checkpointer.wait_until_finished()
        expected = [s for s in range(1, last + 1) if s % interval == 0] + [last]
        assert saved == expected
        assert checkpointer.all_steps() == expected[-keep:]
        assert checkpointer.latest_step() == last
        assert not checkpointer.should_save(9) and not checkpointer.should_save(0)
        assert checkpointer.should_save(12) and not checkpointer.should_save(13)
        with pytest.raises(CheckpointError, match=r"cannot save step 4 .* newer step 10"):
            checkpointer.save(4, {"x": jnp.zeros(2)}, {}, force=True)
        restored, metadata = checkpointer.restore({"x": jnp.zeros(2, jnp.int32)}, step=9)
    assert metadata == {"step": 9} and restored["x"].tolist() == [9, 9]
    on_disk = sorted(int(name) for name in os.listdir(tmp_path) if name.isdigit())
    assert on_disk == expected[-keep:]


def test_a_reader_sees_the_steps_another_writer_adds_after_reload(tmp_path):
    with Checkpointer(str(tmp_path), save_interval=1) as writer, Checkpointer(str(tmp_path), save_interval=1) as reader:
        writer.save(1, {"x": jnp.arange(3)}, {"data_position": 7})
        writer.wait_until_finished()
        assert reader.latest_step() is None  # cached listing
        reader.reload()
        assert reader.latest_step() == 1 and reader.read_metadata() == {"data_position": 7}


def test_save_interval_zero_saves_only_when_forced(tmp_path):
    with Checkpointer(str(tmp_path), save_interval=0, max_to_keep=None) as checkpointer:
        assert not any(checkpointer.save(s, {"x": jnp.ones(1)}, {}) for s in range(5))
        assert checkpointer.save(5, {"x": jnp.ones(1)}, {}, force=True)
        assert checkpointer.all_steps() == [5]


# --------------------------------------------------------------------------------------------
# Asynchronous and atomic writes
# --------------------------------------------------------------------------------------------


def test_async_save_owns_its_data_once_save_returns(tmp_path):
    """After save() returns, the device buffers may be deleted (donated) and NumPy buffers changed."""
    device = jnp.arange(1 << 16, dtype=jnp.float32)
    host = np.arange(8, dtype=np.int64)
    want = {"device": np.asarray(device).copy(), "host": host.copy()}
    with Checkpointer(str(tmp_path), save_interval=1, async_save=True) as checkpointer:
        assert checkpointer.save(1, {"device": device, "host": host}, {})
        device.delete()
        host[:] = -1
        checkpointer.wait_until_finished()
        restored, _ = checkpointer.restore({"device": jnp.zeros(1 << 16), "host": np.zeros(8, np.int64)})
    np.testing.assert_array_equal(np.asarray(restored["device"]), want["device"])
    np.testing.assert_array_equal(restored["host"], want["host"])


def test_sigkill_during_an_async_write_resumes_from_the_last_complete_checkpoint(tmp_path):
    directory = str(tmp_path / "ckpt")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    worker = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "ckpt_kill_worker.py"), directory],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = worker.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.startswith("SAVING 2"):
                os.kill(worker.pid, signal.SIGKILL)  # mid-write: step 2 is in its tmp directory
                break
    finally:
        worker.kill()
        worker.wait(timeout=60)
    assert lines[-1:] == ["SAVING 2"], f"the worker did not reach the second save: {lines}"
    assert worker.returncode == -signal.SIGKILL

    entries = sorted(os.listdir(directory))
    assert "2" not in entries, f"step 2 was finalized before the kill; make the state bigger ({entries})"
    partial = [e for e in entries if e.startswith("2.orbax-checkpoint-tmp")]
    assert partial, entries  # the interrupted write is on disk...
    assert not os.path.exists(os.path.join(directory, partial[0], "commit_success.txt"))  # ...not committed
    assert os.path.exists(os.path.join(directory, "1", "commit_success.txt"))

    expected = make_state(1)
    target = jax.tree.map(lambda x: jnp.zeros_like(x) if isinstance(x, np.ndarray) else x, expected)
    with Checkpointer(directory, save_interval=1, max_to_keep=3) as checkpointer:
        assert checkpointer.latest_step() == 1 and checkpointer.all_steps() == [1]
        restored, metadata = checkpointer.restore(target)
        assert metadata == {"data_position": 10}
        want = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, expected)
        assert_bit_identical(restored, want)
        # The resumed run writes step 2 again; the leftover tmp directory is gone.
        assert checkpointer.save(2, {"params": {"w0": jnp.ones(3)}}, {"data_position": 20})
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [1, 2]
    assert not [e for e in os.listdir(directory) if "orbax-checkpoint-tmp" in e]


# --------------------------------------------------------------------------------------------
# Sharded save and restore
# --------------------------------------------------------------------------------------------

# Qwen parameter names, so that the Qwen partition rules place them (4 heads of 8, 2 kv heads).
SHAPES = {
    "model": {
        "embed_tokens": {"embedding": (64, 32)},
        "layers": {
            "0": {
                "self_attn": {"q_proj": {"kernel": (32, 32), "bias": (32,)}, "k_proj": {"kernel": (32, 16)}},
                "mlp": {"down_proj": {"kernel": (64, 32)}},
                "input_layernorm": {"weight": (32,)},
            }
        },
        "norm": {"weight": (32,)},
    },
    "lm_head": {"kernel": (32, 64)},
}
OPT = optax.adam(1e-3)


def _is_shape(x):
    return isinstance(x, tuple)


def _sharded_train_state(mesh):
    rules = S.qwen_rules(2, mesh.shape["tp"])
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.standard_normal(s).astype(np.float32), SHAPES, is_leaf=_is_shape)
    params = S.shard_tree(params, mesh, rules)
    opt_state = OPT.init(params)
    opt_state = (opt_state[0]._replace(count=jnp.array(5, jnp.int32), mu=jax.tree.map(lambda p: p * 0.5, params)),)
    opt_state += OPT.init(params)[1:]
    key = jax.device_put(jax.random.key_data(jax.random.key(3)), NamedSharding(mesh, P()))
    return {"params": params, "opt_state": opt_state, "rng": key, "step": 1}


def _abstract_on(mesh):
    """The restore target: shapes from `eval_shape` (no arrays), shardings from the rules on `mesh`."""
    rules = S.qwen_rules(2, mesh.shape["tp"])
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), SHAPES, is_leaf=_is_shape)
    shapes = {"params": params, "opt_state": jax.eval_shape(OPT.init, params)}
    abstract = {}
    for name, tree in shapes.items():
        shardings = S.tree_shardings(tree, mesh, rules)
        abstract[name] = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings
        )
    abstract["rng"] = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
    abstract["step"] = 0
    return abstract


def test_sharded_save_restores_onto_the_same_and_other_meshes(tmp_path):
    save_mesh = S.make_mesh({"dp": 2, "fsdp": 2, "tp": 2})
    state = _sharded_train_state(save_mesh)
    q_kernel = state["params"]["model"]["layers"]["0"]["self_attn"]["q_proj"]["kernel"]
    assert len({str(s.index) for s in q_kernel.addressable_shards}) == 4  # really split on save
    want = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(1, state, {"mesh": [2, 2, 2]})
        for shape in [(2, 2, 2), (1, 2, 4), (8, 1, 1)]:
            mesh = S.make_mesh(dict(zip(S.AXES, shape)))
            target = _abstract_on(mesh)
            restored, metadata = checkpointer.restore(target)
            assert metadata == {"mesh": [2, 2, 2]}
            got = jax.tree_util.tree_flatten_with_path(restored)[0]
            assert len(got) == len(want)
            for (path, leaf), (_, expected), wanted in zip(got, want, jax.tree.leaves(target)):
                where = f"mesh {shape} {jax.tree_util.keystr(path)}"
                if isinstance(leaf, int):
                    assert leaf == expected, where
                    continue
                assert leaf.sharding == wanted.sharding, where
                global_value = np.asarray(expected)
                assert leaf.dtype == global_value.dtype and np.asarray(leaf).tobytes() == global_value.tobytes(), where
                for shard in leaf.addressable_shards:  # each device holds its slice of the saved array
                    np.testing.assert_array_equal(np.asarray(shard.data), global_value[shard.index], err_msg=where)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_restore_from_a_directory_without_checkpoints_names_it(tmp_path):
    empty = tmp_path / "empty"
    with Checkpointer(str(empty), save_interval=1) as checkpointer:
        assert checkpointer.latest_step() is None and checkpointer.all_steps() == []
        with pytest.raises(CheckpointError, match=f"no complete checkpoint in {empty}"):
            checkpointer.restore({"x": jnp.zeros(2)})


def test_restore_of_a_missing_step_lists_the_steps(tmp_path):
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(2, {"x": jnp.zeros(2)}, {})
        with pytest.raises(CheckpointError, match=r"no checkpoint for step 7 in .*the steps there are \[2\]"):
            checkpointer.restore({"x": jnp.zeros(2)}, step=7)


@pytest.mark.parametrize(
    "target, words",
    [
        ({"params": {"w": jnp.zeros((2, 3))}, "step": 0}, ["not in the target: params/b"]),
        (
            {"params": {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3), "c": jnp.zeros(1)}, "step": 0},
            ["target not in the checkpoint: params/c"],
        ),
        (
            {"params": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(3)}, "step": 0},
            ["shapes differ: params/w: saved (2, 3), target (3, 2)"],
        ),
        ({"params": {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}}, ["not in the target: step"]),
    ],
    ids=["missing-in-target", "missing-in-checkpoint", "shape", "missing-scalar"],
)
def test_a_target_that_does_not_match_names_the_step_and_key(tmp_path, target, words):
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(4, {"params": {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}, "step": 4}, {})
        with pytest.raises(CheckpointError) as error:
            checkpointer.restore(target)
    message = str(error.value)
    assert f"checkpoint {os.path.join(str(tmp_path), '4')} does not match" in message
    for word in words:
        assert word in message


def test_bad_state_metadata_and_arguments_are_named(tmp_path):
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        with pytest.raises(CheckpointError, match=r"'rng' is a typed PRNG key.*jax.random.key_data"):
            checkpointer.save(1, {"rng": jax.random.key(0)}, {})
        with pytest.raises(CheckpointError, match=r"'opt/name' is a str"):
            checkpointer.save(1, {"opt": {"name": "adam", "lr": 1.0}}, {})
        with pytest.raises(CheckpointError, match=r"metadata\['config'\]\['dtype'\] is a type"):
            checkpointer.save(1, {"x": jnp.ones(1)}, {"config": {"dtype": np.float32}})
        with pytest.raises(CheckpointError, match=r"the key 3 of type int"):
            checkpointer.save(1, {"x": jnp.ones(1)}, {"positions": {3: 4}})
        with pytest.raises(CheckpointError, match=r"two leaves of the state have the same key 'a.b'"):
            checkpointer.save(1, {"a.b": jnp.ones(1), "a": {"b": jnp.ones(1)}}, {})
        with pytest.raises(CheckpointError, match=r"step=-1"):
            checkpointer.save(-1, {"x": jnp.ones(1)}, {})
        assert checkpointer.all_steps() == []  # nothing half-saved
        checkpointer.save(1, {"rng": jax.random.key_data(jax.random.key(0))}, {})
        with pytest.raises(CheckpointError, match=r"target leaf 'rng' is a typed PRNG key"):
            checkpointer.restore({"rng": jax.random.key(0)})
    with pytest.raises(ValueError, match="save_interval=-2"):
        Checkpointer(str(tmp_path), save_interval=-2)
    with pytest.raises(ValueError, match="max_to_keep=0"):
        Checkpointer(str(tmp_path), save_interval=1, max_to_keep=0)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(CheckpointError, match=f"{a_file}.*not a directory"):
        Checkpointer(str(a_file), save_interval=1)


def test_a_closed_checkpointer_says_so(tmp_path):
    checkpointer = Checkpointer(str(tmp_path), save_interval=1)
    checkpointer.close()
    checkpointer.close()
    with pytest.raises(CheckpointError, match="closed"):
        checkpointer.save(1, {"x": jnp.ones(1)}, {}, force=True)


def test_metadata_file_is_plain_json(tmp_path):
    """The data position can be read without the library (e.g. by a job scheduler)."""
    with Checkpointer(str(tmp_path), save_interval=1, async_save=False) as checkpointer:
        checkpointer.save(1, {"x": jnp.ones(1)}, {"data_position": 42})
    with open(tmp_path / "1" / "metadata" / "metadata") as f:
        assert json.load(f) == {"data_position": 42}


# --------------------------------------------------------------------------------------------
# Reading a part of a state, read-only (scripts/export_hf.py reads a run's policy so)
# --------------------------------------------------------------------------------------------


def test_a_partial_restore_reads_the_entries_the_target_names_whole(tmp_path):
    """`{"params": ...}` of a saved TrainState-like state: the params come back bit-identical in the target's
    structure (an nnx.State keyed by ints, strings on disk); the other entries are not read. Within an entry named,
    a key or shape that differs is refused as for a whole restore."""
    state = nnx.state(Net(nnx.Rngs(0)))
    saved = {"params": state, "opt_state": OPTIMIZER.init(nnx.to_pure_dict(state)), "step": 3}
    abstract = nnx.state(nnx.eval_shape(lambda: Net(nnx.Rngs(1))))
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(3, saved, {"data_position": 5})
    with Checkpointer(str(tmp_path), save_interval=0, read_only=True) as checkpointer:
        restored, metadata = checkpointer.restore({"params": abstract}, partial=True)
        assert set(restored) == {"params"} and metadata == {"data_position": 5}
        assert isinstance(restored["params"], nnx.State)
        assert_bit_identical(restored["params"], state)
        with pytest.raises(CheckpointError, match="not in the target: opt_state"):
            checkpointer.restore({"params": abstract}, step=3)  # a whole restore checks every entry
        fewer = nnx.to_pure_dict(abstract)
        del fewer["layers"][1]
        with pytest.raises(TargetMismatchError, match=r"/3 does not match .*not in the target: params/layers/1/"):
            checkpointer.restore({"params": fewer}, partial=True)
        with pytest.raises(TargetMismatchError) as error:
            checkpointer.restore({"params": abstract, "critic": {"w": jnp.zeros(2)}}, partial=True)
    assert error.value.differences == ["keys of the target not in the checkpoint: critic/w"]


def test_a_partial_restore_of_a_named_tuple_state(tmp_path):
    """A NamedTuple state (as optax's and the trainer's) is saved with its fields by name: a part restores."""
    params = {"layers": [{"kernel": jnp.arange(6.0).reshape(3, 2)}], "embed": jnp.ones((4, 2), jnp.bfloat16)}
    state = LegacyState(params, (OPTIMIZER.init(params),), jnp.arange(2, dtype=jnp.uint32), 7, (np.float32(0.5),))
    with Checkpointer(str(tmp_path), save_interval=1) as checkpointer:
        checkpointer.save(1, state, {})
        target = {"params": jax.tree.map(jnp.zeros_like, params)}
        restored, _ = checkpointer.restore(target, partial=True)
    assert_bit_identical(restored, {"params": params})


def test_a_read_only_checkpointer_creates_removes_and_saves_nothing(tmp_path):
    """A reader of a run that may still be training: the tmp directory of a save in progress stays (a writer
    takes it for the leftover of a crash and removes it), a missing directory is not created, `save` is refused."""
    missing = tmp_path / "missing"
    with Checkpointer(str(missing), save_interval=0, read_only=True) as reader:
        assert reader.all_steps() == []
    assert not missing.exists()
    with Checkpointer(str(tmp_path), save_interval=1) as writer:
        writer.save(1, {"x": jnp.arange(3)}, {})
    in_progress = tmp_path / "2.orbax-checkpoint-tmp-1700000000"
    in_progress.mkdir()
    with Checkpointer(str(tmp_path), save_interval=1, read_only=True) as reader:
        assert reader.all_steps() == [1] and "read_only=True" in repr(reader)
        restored, _ = reader.restore({"x": jnp.zeros(3, jnp.int32)})
        assert restored["x"].tolist() == [0, 1, 2]
        with pytest.raises(CheckpointError, match="read-only"):
            reader.save(2, {"x": jnp.arange(3)}, {}, force=True)
    assert in_progress.is_dir()
    with Checkpointer(str(tmp_path), save_interval=1) as writer:
        writer.save(3, {"x": jnp.arange(3)}, {})  # a writer's first save waits for its removal of tmp directories
    assert not in_progress.exists()
