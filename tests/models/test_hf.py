"""Hugging Face interop: export/reload round trips, transformers loading our exports, and
errors that name the bad tensor or field."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx, serialization

from mathrl_jax.models import hf, safetensors_io, tiny, value_head
from mathrl_jax.models.hf_config import load_config
from tests.models.conftest import padded_batch, torch_logits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


@pytest.mark.parametrize("variant", ["qwen2", "qwen2_tied", "qwen3"])
def test_export_reload_is_bit_identical_and_loads_in_transformers(hf_checkpoints, tmp_path, variant):
    directory, torch_model = hf_checkpoints[variant]
    model = hf.load_model(directory)
    out = str(tmp_path / "export")
    hf.export_checkpoint(nnx.state(model), model.config, out)
    assert leaves_equal(nnx.state(model), nnx.state(hf.load_model(out)))

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    for name, tensor in torch_model.state_dict().items():
        if variant == "qwen2_tied" and name == "lm_head.weight":
            continue
        np.testing.assert_array_equal(reloaded.state_dict()[name].numpy(), tensor.numpy(), err_msg=name)
    ids, mask = padded_batch(seed=7)
    ours, _ = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    counted = mask.astype(bool)
    np.testing.assert_allclose(torch_logits(reloaded, ids, mask)[counted], np.asarray(ours)[counted], atol=1e-4)


def test_sharded_bfloat16_export_round_trips(hf_checkpoints, tmp_path):
    model = hf.load_model(hf_checkpoints["qwen3"][0], param_dtype="bfloat16")
    out = str(tmp_path / "sharded")
    hf.export_checkpoint(nnx.state(model), model.config, out, max_shard_bytes=20_000)
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    shards = {f for f in os.listdir(out) if f.endswith(".safetensors")}
    assert len(shards) > 2 and set(index["weight_map"].values()) == shards
    reloaded = hf.load_model(out, param_dtype="bfloat16")
    assert leaves_equal(nnx.state(model), nnx.state(reloaded))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(reloaded)))
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert next(torch_model.parameters()).dtype == torch.bfloat16


def test_tiny_checkpoint_is_a_complete_hf_directory(tmp_path):
    directory = str(tmp_path / "tiny")
    config = tiny.write_tiny_checkpoint(directory, seed=3)
    model = hf.load_model(directory)
    assert model.config.vocab_size == config.vocab_size
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    assert n_params < 3_000_000
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tokenizer("12+34=46")["input_ids"]
    assert len(ids) == 8 and max(ids) < config.vocab_size
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    batch = np.asarray([ids])
    np.testing.assert_allclose(torch_logits(torch_model, batch), np.asarray(model(jnp.asarray(batch))[0]), atol=1e-4)
    # A different seed gives different weights; the same seed the same.
    assert not leaves_equal(nnx.state(model), nnx.state(hf.load_model(_tiny(tmp_path, "other", seed=4))))
    assert leaves_equal(nnx.state(model), nnx.state(hf.load_model(_tiny(tmp_path, "same", seed=3))))


def _tiny(tmp_path, name, seed):
    directory = str(tmp_path / name)
    tiny.write_tiny_checkpoint(directory, seed=seed)
    return directory


def test_sharded_load_places_each_tensor_by_its_sharding(hf_checkpoints):
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 (simulated) devices")
    mesh = jax.sharding.Mesh(np.array(devices[:8]).reshape(2, 4), ("data", "model"))
    P = jax.sharding.PartitionSpec

    def sharding_fn(path, shape):
        # Shard the last axis over "model" where it divides, else replicate.
        spec = P(*([None] * (len(shape) - 1) + ["model"])) if shape[-1] % 4 == 0 else P()
        return jax.sharding.NamedSharding(mesh, spec)

    directory = hf_checkpoints["qwen2"][0]
    sharded = hf.load_state(directory, load_config(directory), sharding_fn)
    plain = nnx.state(hf.load_model(directory))
    for (path, value), (_, reference) in zip(nnx.to_flat_state(sharded), nnx.to_flat_state(plain)):
        array = value[...]
        assert array.sharding == sharding_fn(path, array.shape), path
        np.testing.assert_array_equal(array, reference[...])
    q_kernel = sharded["model"]["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    assert q_kernel.addressable_shards[0].data.shape == (64, 64 // 4)


# --- bad checkpoints -----------------------------------------------------------------------


@pytest.fixture
def checkpoint_copy(hf_checkpoints, tmp_path):
    directory = str(tmp_path / "copy")
    shutil.copytree(hf_checkpoints["qwen2"][0], directory)
    return directory


def _rewrite_tensors(directory, edit):
    """Rewrites model.safetensors after `edit(dict of name -> array)`."""
    path = os.path.join(directory, "model.safetensors")
    file = safetensors_io.SafetensorsFile(path)
    tensors = {name: np.array(file.get(name)) for name in file.keys()}
    del file
    edit(tensors)
    safetensors_io.write_safetensors(path, tensors)


def test_missing_tensor_is_named(checkpoint_copy):
    _rewrite_tensors(checkpoint_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(hf.ModelCheckpointError, match=r"missing tensors model\.layers\.1\.mlp\.up_proj\.weight"):
        hf.load_model(checkpoint_copy)


def test_wrong_shape_is_named(checkpoint_copy):
    def edit(tensors):
        tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 64), np.float32)

    _rewrite_tensors(checkpoint_copy, edit)
    mismatch = r"model\.layers\.0\.self_attn\.k_proj\.weight.*\(8, 64\).*\(32, 64\)"
    with pytest.raises(hf.ModelCheckpointError, match=mismatch):
        hf.load_model(checkpoint_copy)


def test_unexpected_tensor_is_named(checkpoint_copy):
    _rewrite_tensors(checkpoint_copy, lambda t: t.update({"model.layers.9.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(hf.ModelCheckpointError, match=r"model\.layers\.9\.extra\.weight"):
        hf.load_model(checkpoint_copy)


def test_truncated_file_is_reported(checkpoint_copy):
    path = os.path.join(checkpoint_copy, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(hf.ModelCheckpointError, match="truncated"):
        hf.load_model(checkpoint_copy)


def test_unknown_architecture_is_named(checkpoint_copy):
    path = os.path.join(checkpoint_copy, "config.json")
    config = json.load(open(path))
    config["architectures"] = ["LlamaForCausalLM"]
    json.dump(config, open(path, "w"))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        hf.load_model(checkpoint_copy)


def test_missing_files_are_named(tmp_path, checkpoint_copy):
    with pytest.raises(ValueError, match="no config.json"):
        hf.load_model(str(tmp_path))
    os.remove(os.path.join(checkpoint_copy, "model.safetensors"))
    with pytest.raises(hf.ModelCheckpointError, match="no model.safetensors"):
        hf.load_model(checkpoint_copy)


def test_index_naming_a_missing_shard_is_reported(hf_checkpoints, tmp_path):
    model = hf.load_model(hf_checkpoints["qwen2"][0])
    out = str(tmp_path / "sharded")
    hf.export_checkpoint(nnx.state(model), model.config, out, max_shard_bytes=30_000)
    victim = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))[1]
    os.remove(os.path.join(out, victim))
    with pytest.raises(hf.ModelCheckpointError, match=victim):
        hf.load_model(out)


# --- critic and PRM -------------------------------------------------------------------------


def test_critic_loads_trunk_exports_as_token_classifier_and_matches_transformers(hf_checkpoints, tmp_path):
    directory = hf_checkpoints["qwen3"][0]
    critic = value_head.load_critic(directory)
    ids, mask = padded_batch(seed=8)
    assert np.all(np.asarray(critic(jnp.asarray(ids))) == 0.0)  # a new head predicts 0
    # The trunk is the causal LM's.
    lm = hf.load_model(directory)
    hidden, _ = lm(jnp.asarray(ids), attention_mask=jnp.asarray(mask), return_hidden=True)
    rng = np.random.RandomState(0)
    critic.score.kernel[...] = jnp.asarray(rng.randn(64, 1).astype(np.float32))
    critic.score.bias[...] = jnp.asarray([0.5], jnp.float32)
    values = critic(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    counted = mask.astype(bool)
    expected = np.asarray(hidden) @ np.asarray(critic.score.kernel[...])[:, 0] + 0.5
    np.testing.assert_allclose(np.asarray(values)[counted], expected[counted], atol=1e-4)

    out = str(tmp_path / "critic")
    value_head.export_critic(critic, out)
    torch_critic = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    torch_values = torch_logits(torch_critic, ids, mask)[..., 0]
    np.testing.assert_allclose(torch_values[counted], np.asarray(values)[counted], atol=1e-4)
    assert leaves_equal(nnx.state(critic), nnx.state(value_head.load_critic(out)))


def test_prm_step_scores_read_the_good_token_probability_at_tags():
    rng = np.random.RandomState(1)
    logits = rng.randn(2, 6, 11).astype(np.float32)
    ids = np.array([[1, 9, 2, 3, 9, 4], [9, 5, 5, 5, 5, 9]])
    scores, tags = value_head.prm_step_scores(
        jnp.asarray(logits), jnp.asarray(ids), step_tag_id=9, candidate_token_ids=(7, 8)
    )
    good, bad = logits[..., 7], logits[..., 8]
    expected = np.exp(good) / (np.exp(good) + np.exp(bad)) * (ids == 9)
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    np.testing.assert_array_equal(tags, (ids == 9).astype(np.float32))


def test_prm_scores_ignore_tags_in_padding(hf_checkpoints):
    prm = hf.load_model(hf_checkpoints["qwen2"][0])
    ids = np.array([[3, 4, 9, 5, 9, 9]])
    mask = np.array([[1, 1, 1, 1, 1, 0]])
    scores, tags = value_head.prm_scores(prm, jnp.asarray(ids), jnp.asarray(mask), 9, (7, 8))
    np.testing.assert_array_equal(tags, [[0, 0, 1, 0, 1, 0]])
    assert np.all((np.asarray(scores) > 0) == (np.asarray(tags) > 0))


# --- scripts/export_hf.py -------------------------------------------------------------------


def test_export_script_writes_a_directory_transformers_loads(tmp_path):
    like = _tiny(tmp_path, "tiny", seed=5)
    model = hf.load_model(like)
    params = tmp_path / "params.msgpack"
    params.write_bytes(serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(model))))
    out = str(tmp_path / "exported")
    script = os.path.join(ROOT, "scripts", "export_hf.py")
    done = subprocess.run(
        [sys.executable, script, "--params", str(params), "--like", like, "--out", out],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert leaves_equal(nnx.state(model), nnx.state(hf.load_model(out)))
    assert transformers.AutoTokenizer.from_pretrained(out)("1+1")["input_ids"]

    bad = subprocess.run(
        [sys.executable, script, "--params", str(tmp_path / "nope.msgpack"), "--like", like, "--out", out],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "nope.msgpack" in bad.stderr and "Traceback" not in bad.stderr
