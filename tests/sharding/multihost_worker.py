"""One process of the two-process test: `python multihost_worker.py PID PORT CHECKPOINT OUT`.

Each process has 2 CPU devices; together they form a (dp=1, fsdp=2, tp=2) mesh
over 4 devices on two "hosts". The process loads the checkpoint straight into
the rule shardings, runs a sharded forward pass, gathers the logits and saves them.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

from mathrl_jax.sharding import distributed  # noqa: E402

process_id, port, checkpoint, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from mathrl_jax import sharding as S  # noqa: E402
from mathrl_jax.models import QwenForCausalLM, forward, hf  # noqa: E402
from mathrl_jax.models.hf_config import load_config  # noqa: E402

assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
config = load_config(checkpoint)
mesh = S.make_mesh({"dp": 1, "fsdp": 2, "tp": 2}, num_attention_heads=config.num_attention_heads)
rules = S.qwen_rules(config.num_key_value_heads, 2)
state = hf.load_state(checkpoint, config, S.loader_sharding_fn(mesh, rules))
graphdef = nnx.graphdef(nnx.eval_shape(lambda: QwenForCausalLM(config, rngs=nnx.Rngs(0))))

ids = np.random.RandomState(0).randint(0, config.vocab_size, (4, 12)).astype(np.int32)
batch_sharding = NamedSharding(mesh, S.batch_spec(2))
global_ids = jax.make_array_from_callback(ids.shape, batch_sharding, lambda index: ids[index])
with jax.set_mesh(mesh):
    logits, _ = jax.jit(functools.partial(forward, graphdef))(state, global_ids)
gathered = multihost_utils.process_allgather(logits, tiled=True)
np.save(out, np.asarray(gathered))
distributed.barrier("done")
print(f"process {process_id}: main={distributed.is_main_process()} ok")
