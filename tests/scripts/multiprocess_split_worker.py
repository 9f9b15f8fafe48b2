"""One process of `test_a_sampler_is_shared_out_over_processes_and_gathered_in_order`:
`python multiprocess_split_worker.py OUT_DIR`, joined to the others by the JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID environment.

Each process wraps its own `ArithmeticSampler`, whose completions are a formula of the prompt and the seed it was
given (what a seeded engine's draws are: a function of both), in a `ProcessSplitSampler`, and records what its
sampler was asked and what the run got back."""

import json
import os
import sys

import numpy as np

from mathrl_jax.sharding import distributed

distributed.initialize()

import jax  # noqa: E402

from mathrl_jax.sampling import ProcessSplitSampler, Rollouts, SamplingParams  # noqa: E402
from mathrl_jax.sampling.vllm.server import ServerError  # noqa: E402

POISON = [666]  # a prompt whose request fails, as one to a server that went away


class ArithmeticSampler:
    """Sample j of prompt i (i counted in the prompts it was given) is `[seed + i n + j, sum(prompt)]`."""

    def __init__(self):
        self.tag = f"own-{jax.process_index()}"
        self.asked, self.synced, self.expected = [], None, None

    def update_weights(self, state, version):
        self.synced = (float(np.sum(state["w"])), int(version))

    def expect_weights(self, version):
        self.expected = int(version)

    def generate(self, prompts, params):
        self.asked.append([list(p) for p in prompts])
        if POISON in [list(p) for p in prompts]:
            raise ServerError("the vLLM server at http://127.0.0.1:1 did not answer generation request 0")
        rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        return Rollouts(
            prompt_ids=[list(prompts[i]) for i, _ in rows],
            completion_ids=[[params.seed + i * params.n + j, int(sum(prompts[i]))] for i, j in rows],
            logprobs=[np.array([-0.5, -0.25], np.float32) for _ in rows],
            policy_logprobs=[np.array([np.nan, -0.25], np.float32) for _ in rows],
            finish_reasons=["stop"] * len(rows),
            stop_reasons=[None] * len(rows),
            prompt_indices=np.array([i for i, _ in rows], np.int32),
            policy_version=7,
        )


inner = ArithmeticSampler()
split = ProcessSplitSampler(inner, sends=jax.process_index() == 0)  # a shared server: process 0 syncs it
split.update_weights({"w": np.arange(4.0)}, version=7)
params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=10)
three = split.generate([[1], [2, 3], [4]], params)
one = split.generate([[5]], params)  # process 1's share is empty
try:
    split.generate([[1], POISON], params)  # process 1's request fails
    failure = None
except Exception as error:
    failure = {"type": type(error).__name__, "message": str(error)}
with open(os.path.join(sys.argv[1], f"split{jax.process_index()}.json"), "w") as f:
    json.dump(
        {
            "tag": inner.tag,
            "asked": inner.asked,
            "synced": inner.synced,
            "expected": inner.expected,
            "three": {
                "ids": three.completion_ids,
                "prompts": three.prompt_indices.tolist(),
                "version": three.policy_version,
            },
            "one": {"ids": one.completion_ids, "prompts": one.prompt_indices.tolist()},
            "logprobs": [lp.tolist() for lp in three.policy_logprobs],
            "failure": failure,
        },
        f,
        default=str,
    )
distributed.barrier("done")
