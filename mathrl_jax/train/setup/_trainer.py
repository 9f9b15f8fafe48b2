"""A phase of a run's build: the trainer, from the checkpoint the policy starts at (after any warm-start).

`build_trainer` loads the policy onto the mesh by the partition rules (a LoRA run's adapters apart from its frozen
base), the critic where the algorithm has one, their optimizers, the `TrainState`, and the jitted update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
from flax import nnx

import mathrl_jax.train.setup._sections as sections
from mathrl_jax import sharding
from mathrl_jax.compile_options import trainer_pass_options
from mathrl_jax.models import hf, value_head
from mathrl_jax.train import algorithms
from mathrl_jax.train import state as state_lib
from mathrl_jax.train import update as update_lib
from mathrl_jax.train.setup._micro_batches import micro_batch_rows
from mathrl_jax.train.update import UpdateConfig


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What the build made of the policy: the mesh and the model on it, its graph and starting params (the
    reference's, with a KL term), a LoRA run's frozen base, the critic's graph and frozen trunk, the `TrainState`
    the run starts from (before a checkpoint's restore), and the jitted update with its config."""

    mesh: Any
    model: Any
    graphdef: Any
    params: Any
    frozen: Any
    critic_graphdef: Any
    critic_frozen: Any
    state: state_lib.TrainState
    update: Callable
    update_config: UpdateConfig
    algorithm: algorithms.Algorithm


def build_trainer(config, start_dir: str) -> Trainer:
    mesh = sharding.make_mesh(config.mesh.to_dict())
    numerics = dict(
        param_dtype=config.param_dtype, dtype=config.dtype, attention=config.attention, scan_layers=config.scan_layers
    )
    adapters = sections.lora_settings(config)
    remat = dict(remat=config.remat, remat_policy=config.remat_policy)
    model = hf.load_model(start_dir, **remat, lora_seed=config.seed, **adapters, **numerics)
    rules = sharding.qwen_rules(model.config.num_key_value_heads, mesh.shape["tp"])
    frozen = None
    if model.config.lora_rank:  # the adapters train (TrainState.params, the optimizer's); the base stays put
        graphdef, params, frozen = nnx.split(model, nnx.LoRAParam, ...)
        frozen = sharding.shard_tree(frozen, mesh, rules)
    else:
        graphdef, params = nnx.split(model)
    params = sharding.shard_tree(params, mesh, rules)
    algorithm = sections.algorithm_of(config)
    optimizer_settings, critic_optimizer_settings = sections.optimizer_settings_of(config)
    optimizer, schedule = state_lib.make_optimizer(**optimizer_settings, return_schedule=True)
    critic_graphdef, critic_params, critic_frozen = _critic(config, algorithm, model, frozen, start_dir, numerics)
    if critic_params is not None:
        critic_params = sharding.shard_tree(critic_params, mesh, rules)
    critic_optimizer, critic_schedule = None, None
    if algorithm.critic:
        critic_optimizer, critic_schedule = state_lib.make_optimizer(**critic_optimizer_settings, return_schedule=True)
    state = state_lib.create_train_state(
        params, optimizer, seed=config.seed, critic_params=critic_params, critic_optimizer=critic_optimizer
    )
    state = state_lib.place_state(state, mesh, rules)
    batch_shards = mesh.shape["dp"] * mesh.shape["fsdp"]
    update_config = sections.update_config(config, micro_batch_rows(config, model.config, batch_shards))
    update = update_lib.make_update_fn(
        graphdef,
        optimizer,
        update_config,
        critic_optimizer=critic_optimizer,
        critic_graphdef=critic_graphdef,
        critic_shares_base=critic_frozen is not None,
        learning_rate=schedule,  # the rates logged (train/lr, train/value_lr)
        critic_learning_rate=critic_schedule,
        # The asynchronous generator samples with the params the learner is updating: donating them to the
        # update would free buffers another thread is reading.
        donate=not sections.runs_ahead(config),
        state_shardings=jax.tree.map(lambda leaf: leaf.sharding, state),  # the rules', call after call
        compiler_options=trainer_pass_options(model.config.vocab_size),
    )
    return Trainer(
        mesh, model, graphdef, params, frozen, critic_graphdef, critic_frozen, state, update, update_config, algorithm
    )


def _critic(config, algorithm, model, frozen, start_dir: str, numerics) -> tuple[Any, Optional[Any], Any]:
    """(graph, params, frozen trunk) of the critic: OpenR's (the policy's frozen base under an MLP head), one of
    its own from the starting checkpoint, or none."""
    if algorithm.critic and config.lora.share_critic_base:
        critic_graphdef, critic_params = value_head.frozen_base_critic(model.config, seed=config.seed)
        return critic_graphdef, critic_params, value_head.frozen_trunk(frozen)
    if algorithm.critic:
        critic_graphdef, critic_params = nnx.split(value_head.load_critic(start_dir, seed=config.seed, **numerics))
        return critic_graphdef, critic_params, None
    return None, None, None
