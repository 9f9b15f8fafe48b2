"""`micro_batch_size = 0` sizes the update's micro-batches from `micro_batch_gib`: the estimate follows XLA's own
memory analysis of the update, the rows chosen are the most that fit, and a run with them trains exactly as one
given those rows by hand."""

import jax
import pytest
from flax import nnx

from benchmarks.gpu import grpo_batch
from mathrl_jax.models import QwenForCausalLM, tiny_config
from mathrl_jax.models.qwen import REMAT_POLICIES
from mathrl_jax.train.setup._micro_batches import GIB, activation_bytes, micro_batch_rows
from mathrl_jax.train.state import create_train_state, make_optimizer
from mathrl_jax.train.update import UpdateConfig, make_update_fn
from tests.train.loop_fixtures import model_dir, run_and_record, small_config  # noqa: F401


def xla_temporaries(model_config, rows: int, width: int) -> int:
    """XLA's temporaries of the trainer's update (AdamW, the whole minibatch in one pass), from shapes alone."""
    graphdef, params = nnx.eval_shape(lambda: nnx.split(QwenForCausalLM(model_config, rngs=nnx.Rngs(0))))
    optimizer = make_optimizer(1e-6, name="adamw")
    state = jax.eval_shape(lambda p: create_train_state(p, optimizer, seed=0), params)
    update = make_update_fn(graphdef, optimizer, UpdateConfig(num_mini_batch=1), donate=True)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in grpo_batch(rows, width // 4, width, 512).items()}
    return update.lower(state, batch).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_estimate_follows_the_growth_of_xlas_temporaries(dtype):
    """Per token added to the pass, within 0.85-1.25x of what XLA's memory analysis adds."""
    model_config = tiny_config(hidden_size=128, intermediate_size=384, num_hidden_layers=2, vocab_size=512, dtype=dtype)
    width = 64
    per_token = (xla_temporaries(model_config, 32, width) - xla_temporaries(model_config, 8, width)) / (24 * width)
    estimate = activation_bytes(model_config, 1, width, remat=False)
    assert 0.85 < estimate / per_token < 1.25, (estimate, per_token)
    assert activation_bytes(model_config, 10, width, remat=False) == 10 * estimate
    assert activation_bytes(model_config, 1, width, remat=True) < estimate


def test_each_remat_policy_keeps_more_and_the_estimate_follows():
    """With the layers scanned (where XLA:CPU keeps remat's saving), each policy that keeps more of a layer's forward
    holds more temporaries per token, all below no remat's; the estimate follows each within 0.8-1.25x (bfloat16
    compute, as at real sizes; in float32 at 4 layers the estimate was 0.96-1.09x of the growth, 2026-11-29)."""
    dtype = "bfloat16"
    width, per_token, estimate = 64, {}, {}
    for policy in (None,) + REMAT_POLICIES:
        remat = dict(remat=policy is not None, remat_policy=policy or "nothing_saveable", scan_layers=True)
        model_config = tiny_config(
            hidden_size=128, intermediate_size=384, num_hidden_layers=2, vocab_size=512, dtype=dtype, **remat
        )
        grown = xla_temporaries(model_config, 32, width) - xla_temporaries(model_config, 8, width)
        per_token[policy] = grown / (24 * width)
        if policy is not None:
            estimate[policy] = activation_bytes(model_config, 1, width, remat=True, policy=policy)
    order = [per_token[p] for p in REMAT_POLICIES + (None,)]
    assert order == sorted(order) and len(set(order)) == len(order), per_token
    for policy in REMAT_POLICIES:
        assert 0.8 < estimate[policy] / per_token[policy] < 1.25, (policy, estimate[policy], per_token[policy])


class Settings(dict):
    __getattr__ = dict.__getitem__


def settings(**overrides):
    base = dict(
        micro_batch_size=0,
        micro_batch_gib=4.0,
        n_rollout_threads=8,
        group_size=8,
        env_name="",
        episode_length=1,
        num_mini_batch=4,  # minibatches of 16 rows
        max_prompt_length=16,
        max_new_tokens=112,
        remat=False,
        remat_policy="nothing_saveable",
        scan_layers=False,
    )
    return Settings(base, **overrides)


def test_the_rows_chosen_are_the_most_whose_estimate_fits(capsys):
    model_config = tiny_config(hidden_size=256, intermediate_size=1024, num_hidden_layers=8)
    per_row = activation_bytes(model_config, 128, 128, remat=False)
    assert micro_batch_rows(settings(micro_batch_gib=16 * per_row / GIB), model_config, 1) is None
    assert capsys.readouterr().err == ""  # the whole minibatch fits: one pass, nothing said
    for fits, chosen in [(15, 8), (8, 8), (7.9, 4), (4, 4), (2.5, 2), (0.5, 1)]:
        budget = fits * per_row / GIB
        assert micro_batch_rows(settings(micro_batch_gib=budget), model_config, 1) == chosen
        assert f"micro-batches of {chosen} rows" in capsys.readouterr().err
    # over a mesh of 4 batch shards, a micro-batch splits over them; where none fits, the smallest that does
    assert micro_batch_rows(settings(micro_batch_gib=7.9 * per_row / GIB), model_config, 4) == 4
    assert micro_batch_rows(settings(micro_batch_gib=2.5 * per_row / GIB), model_config, 4) == 4
    assert micro_batch_rows(settings(micro_batch_gib=2.5 * per_row / GIB), model_config, 16) is None  # one pass
    assert micro_batch_rows(settings(micro_batch_gib=1e-9, micro_batch_size=2), model_config, 1) == 2  # set: kept


def test_a_run_sized_by_the_budget_trains_as_one_given_those_rows(model_dir, tmp_path, capsys):  # noqa: F811
    common = dict(num_iterations=2, packing=False, max_new_tokens=8, num_mini_batch=2)
    _, chosen = run_and_record(small_config(model_dir, tmp_path / "budget", micro_batch_gib=1e-4, **common))
    said = capsys.readouterr().err
    assert "micro-batches of " in said
    rows = int(said.split("micro-batches of ")[1].split()[0])
    assert rows == 8  # minibatches of 16 rows (8 prompts x 4 samples, 2 minibatches), over 8 devices' batch shards
    _, given = run_and_record(small_config(model_dir, tmp_path / "given", micro_batch_size=rows, **common))
    assert [m["train/loss"] for _, m in chosen] == [m["train/loss"] for _, m in given]
