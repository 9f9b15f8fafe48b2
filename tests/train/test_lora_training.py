"""LoRA through the training loop: the adapters alone train (the optimizer's and the checkpoint's state), the base
stays bit-identical, the exports (merged Hugging Face checkpoint, PEFT adapters) agree, a resume is exact and one
onto other base weights is refused, and a sharded run trains as an unsharded one."""

import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.errors import TrainingError
from mathrl_jax.models import hf, peft_adapters, write_tiny_checkpoint
from mathrl_jax.models.safetensors_io import checkpoint_tensors
from mathrl_jax.train import loop, run_directory
from mathrl_jax.train.checkpoint._checkpointer import Checkpointer
from tests.train.loop_fixtures import (  # noqa: F401  (the fixture)
    model_dir,
    run_and_record,
    small_config,
)

LORA = {"lora.rank": 4, "lora.alpha": 8.0, "lora.targets": "q_proj,v_proj,up_proj"}
ADAPTED = ("self_attn.q_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")


def _tensors(directory):
    return {name: np.asarray(file.get(name)) for name, file in checkpoint_tensors(directory).items()}


def _paths(tree):
    return [
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def test_a_lora_run_trains_its_adapters_alone(model_dir, tmp_path):  # noqa: F811
    """(That the step is right: `test_update.test_a_lora_step_is_the_chain_rule_of_the_full_step`; that it learns:
    the slow learning test.)"""
    config = small_config(model_dir, tmp_path / "run", num_iterations=3, kl_coef=0.01, **LORA)  # ref: the base
    summary, history = run_and_record(config)
    assert all(np.isfinite(m["train/kl"]) and m["train/skipped_updates"] == 0 for _, m in history)
    assert history[-1][1]["train/kl"] > 0  # the policy left the reference (its adapters at B = 0)
    state = summary["state"]
    # What trains and what the optimizer holds: the adapters (AdamW's two moments of each), nothing of the base.
    adapter_paths = _paths(state.params)
    assert adapter_paths and all("/lora/lora_" in p for p in adapter_paths)
    assert len(adapter_paths) == 2 * 3  # A and B on three projections of one layer
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) == 2]
    assert sorted(x.shape for x in moments) == sorted(2 * [x.shape for x in jax.tree.leaves(state.params)])
    # The merged export: the adapted projections moved, every other tensor is the base's, bit for bit.
    base, final = _tensors(model_dir), _tensors(str(tmp_path / "run" / "final_model"))
    assert set(base) == set(final)
    for name in base:
        if name.endswith(ADAPTED):
            assert not np.array_equal(base[name], final[name]), name
        else:
            np.testing.assert_array_equal(base[name], final[name], err_msg=name)
    # The PEFT adapters on the base give the merged model's logits.
    adapter_dir = str(tmp_path / "run" / run_directory.FINAL_ADAPTER)
    assert peft_adapters.read_adapter_config(adapter_dir)["base_model_name_or_path"] == os.path.abspath(model_dir)
    adapted = hf.load_model(model_dir, lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj,up_proj")
    graphdef, adapters, rest = nnx.split(adapted, nnx.LoRAParam, ...)
    nnx.replace_by_pure_dict(adapters, peft_adapters.read_adapters(adapter_dir, adapted.config))
    ids = np.random.default_rng(0).integers(3, 40, size=(2, 7))
    got = nnx.merge(graphdef, adapters, rest)(ids)[0]
    want = hf.load_model(str(tmp_path / "run" / "final_model"))(ids)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_a_lora_resume_is_bit_identical_and_its_checkpoints_hold_adapters_only(model_dir, tmp_path):  # noqa: F811
    straight, straight_history = run_and_record(small_config(model_dir, tmp_path / "a", num_iterations=4, **LORA))
    run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=2, save_interval=2, **LORA))
    with Checkpointer(str(tmp_path / "b" / "checkpoints"), save_interval=2) as checkpointer:
        saved = checkpointer.saved_shapes(2)
        metadata = checkpointer.read_metadata()
    params = [name for name in saved if name.startswith("params/")]
    assert params and all("/lora/" in name for name in params), params
    assert not any(name.endswith(("kernel", "embedding")) for name in saved)
    assert metadata["lora_base"]["path"] == os.path.abspath(model_dir) and len(metadata["lora_base"]["sha256"]) == 64
    respelled = dict(LORA, **{"lora.targets": "up_proj, v_proj,q_proj"})  # the same targets, another spelling
    resumed, resumed_history = run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=4, **respelled))
    assert [i for i, _ in resumed_history] == [3, 4]
    for a, b in zip(
        jax.tree.leaves(jax.device_get(straight["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for (_, a), (_, b) in zip(straight_history[2:], resumed_history):
        for key in ("rollout/rewards", "train/policy_loss", "train/grad_norm"):
            assert a[key] == b[key], key


def test_a_lora_resume_onto_other_base_weights_is_refused_before_writing(tmp_path):
    base = str(tmp_path / "base")
    write_tiny_checkpoint(base, seed=0, num_hidden_layers=1)
    run_dir = tmp_path / "run"
    run_and_record(small_config(base, run_dir, num_iterations=2, save_interval=2, **LORA))
    metrics_before = (run_dir / "metrics.jsonl").read_bytes()
    shutil.rmtree(base)
    write_tiny_checkpoint(base, seed=1, num_hidden_layers=1)  # same path and shapes, other weights
    with pytest.raises(TrainingError, match="LoRA adapters trained on the base .* differs"):
        loop.train(small_config(base, run_dir, num_iterations=4, **LORA))
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics_before
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["2"]


@pytest.mark.slow
@pytest.mark.parametrize("critic", [None, "shared"])
def test_a_sharded_lora_run_trains_as_an_unsharded_one(critic, model_dir, tmp_path):  # noqa: F811
    """The adapters' partition rules under fsdp x tp (A split like its kernel's input, B like its output); with
    a critic on the frozen base, its head (replicated) and its trunk (the base's shards)."""
    settings = dict(num_iterations=2, **LORA)
    keys = ["rollout/rewards", "train/policy_loss", "train/grad_norm"]
    if critic:
        settings.update({"algorithm_name": "ppo", "lora.share_critic_base": True})
        keys += ["train/value_loss", "train/value_grad_norm"]
    _, single = run_and_record(small_config(model_dir, tmp_path / "one", **settings))
    _, sharded = run_and_record(
        small_config(model_dir, tmp_path / "mesh", **{"mesh.dp": 2, "mesh.fsdp": 2, "mesh.tp": 2}, **settings)
    )
    for (i, a), (j, b) in zip(single, sharded):
        assert i == j
        for key in keys:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_export_hf_merges_a_lora_checkpoint_into_its_base_and_refuses_another_base(model_dir, tmp_path):  # noqa: F811
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run_dir = tmp_path / "run"
    run_and_record(small_config(model_dir, run_dir, num_iterations=2, save_interval=2, **LORA))
    export = [sys.executable, os.path.join(root, "scripts", "export_hf.py"), str(run_dir)]
    done = subprocess.run([*export, "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The last checkpoint is the final policy: the same merged tensors as final_model.
    got, want = _tensors(str(tmp_path / "out")), _tensors(str(run_dir / "final_model"))
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    other = str(tmp_path / "other")
    write_tiny_checkpoint(other, seed=3, num_hidden_layers=1)
    done = subprocess.run([*export, "--like", other, "--out", str(tmp_path / "out2")], capture_output=True, text=True)
    assert done.returncode == 2 and "differs" in done.stderr, done.stderr
    assert not os.path.exists(tmp_path / "out2")


@pytest.mark.parametrize(
    "scan_layers", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unrolled", "scanned"]
)
def test_a_lora_run_with_remat_trains_as_without_it(scan_layers, model_dir, tmp_path):  # noqa: F811
    """Remat and several micro-batches: the adapted model is rebuilt inside NNX's lifted transform, which failed
    (TraceContextError) while the joined state handed it the base's Variables of the outer trace."""
    settings = dict(num_iterations=2, micro_batch_size=2, packing=False, scan_layers=scan_layers, **LORA)
    _, plain = run_and_record(small_config(model_dir, tmp_path / "plain", **settings))
    _, remat = run_and_record(small_config(model_dir, tmp_path / "remat", remat=True, **settings))
    for (i, a), (j, b) in zip(plain, remat):
        assert i == j
        for key in ("rollout/rewards", "train/policy_loss", "train/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-7, err_msg=key)


def test_a_run_of_every_weight_is_not_resumed_as_a_lora_run(model_dir, tmp_path):  # noqa: F811
    """Also one saved before `lora` existed (its config.json without the section: it trained every weight): the
    config check names lora.rank, which no `resume_allow_changes` lets change; without a config.json to compare,
    the settings the checkpoint recorded name it (issue 60), before any restore, as they do the keys no resume may
    change."""
    import json

    run_dir = tmp_path / "run"
    run_and_record(small_config(model_dir, run_dir, num_iterations=2, save_interval=2))
    saved = json.loads((run_dir / "config.json").read_text())
    del saved["lora"]
    (run_dir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(TrainingError, match=r"lora\.rank: 0 -> 4"):
        loop.train(small_config(model_dir, run_dir, num_iterations=4, **LORA))
    allowed = dict(LORA, resume_allow_changes="lora.rank,lora.alpha,lora.targets")
    with pytest.raises(TrainingError, match=r"\['lora.rank', 'lora.targets'\] decide what the checkpoint holds"):
        loop.train(small_config(model_dir, run_dir, num_iterations=4, **allowed))
    (run_dir / "config.json").unlink()
    with pytest.raises(TrainingError, match=r"was saved by a run with other settings \(.*lora\.rank: 0 -> 4"):
        loop.train(small_config(model_dir, run_dir, num_iterations=4, **LORA))
    with pytest.raises(TrainingError, match=r"\['lora.rank', 'lora.targets'\] decide what the checkpoint holds"):
        loop.train(small_config(model_dir, run_dir, num_iterations=4, **allowed))


def test_a_finished_lora_run_without_its_adapters_exports_them_when_rerun(model_dir, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    run_and_record(small_config(model_dir, run_dir, num_iterations=1, **LORA))
    adapters = (run_dir / run_directory.FINAL_ADAPTER / "adapter_model.safetensors").read_bytes()
    shutil.rmtree(run_dir / run_directory.FINAL_ADAPTER)  # killed between the two exports
    run_and_record(small_config(model_dir, run_dir, num_iterations=1, **LORA))
    assert (run_dir / run_directory.FINAL_ADAPTER / "adapter_model.safetensors").read_bytes() == adapters


@pytest.mark.parametrize("algorithm", ["appo", "async_ppo"])
def test_lora_trains_with_a_critic_and_asynchronously(algorithm, model_dir, tmp_path):  # noqa: F811
    """The policy's adapters beside a critic of every weight (APPO), and the asynchronous generator sampling with
    the joined model of an older version (async_ppo)."""
    settings = dict(num_iterations=2, algorithm_name=algorithm, **LORA)
    settings.update({"appo": {"step_separator": "+"}, "async_ppo": {"max_head_offpolicyness": 1}}[algorithm])
    summary, history = run_and_record(small_config(model_dir, tmp_path / algorithm, **settings))
    assert all(np.isfinite(m["train/policy_loss"]) and m["train/skipped_updates"] == 0 for _, m in history)
    assert all("/lora/lora_" in p for p in _paths(summary["state"].params))
    if algorithm == "appo":
        assert all(np.isfinite(m["train/value_loss"]) for _, m in history)
        assert any("score/kernel" in p for p in _paths(summary["state"].critic_params))


def test_a_critic_sharing_the_frozen_base_trains_its_head_alone_and_resumes_exactly(model_dir, tmp_path):  # noqa: F811
    """`lora.share_critic_base` (OpenR's critic): the critic's state and AdamW's moments hold its MLP head alone, the
    head trains (the value loss falls from its first minibatch), and a resume restores it bit for bit."""
    settings = dict(algorithm_name="ppo", **LORA, **{"lora.share_critic_base": True})
    straight, history = run_and_record(small_config(model_dir, tmp_path / "a", num_iterations=4, **settings))
    critic = straight["state"].critic_params
    paths = _paths(critic)
    assert paths and all(p.startswith("value_head/") for p in paths), paths
    moments = [x for x in jax.tree.leaves(straight["state"].critic_opt_state) if np.ndim(x) == 2]
    assert sorted(x.shape for x in moments) == sorted(2 * [x.shape for x in jax.tree.leaves(critic)])
    assert all(np.isfinite(m["train/value_loss"]) for _, m in history)
    assert history[-1][1]["train/value_loss"] < history[0][1]["train/value_loss"]
    from mathrl_jax.models import value_head

    _, initial = value_head.frozen_base_critic(hf.load_model(model_dir).config, seed=0)  # the run's seed
    for start, end in zip(jax.tree.leaves(initial), jax.tree.leaves(critic)):
        assert start.shape == end.shape and not np.allclose(np.asarray(start), np.asarray(end))  # each layer trained
    run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=2, save_interval=2, **settings))
    with Checkpointer(str(tmp_path / "b" / "checkpoints"), save_interval=2) as checkpointer:
        saved = checkpointer.saved_shapes(2)
    assert not any(name.endswith(("kernel", "embedding")) and "value_head" not in name and "lora" not in name
                   for name in saved)  # fmt: skip
    resumed, _ = run_and_record(small_config(model_dir, tmp_path / "b", num_iterations=4, **settings))
    for a, b in zip(
        jax.tree.leaves(jax.device_get(straight["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
