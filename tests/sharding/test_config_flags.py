"""The mesh flags of the config files parse from a real command line into a mesh."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A stand-in for a training script's flag handling (ml_collections reads overrides from sys.argv).
PROGRAM = """
import json, sys
from absl import flags
from ml_collections import config_flags
config_flags.DEFINE_config_file("config", default="mathrl_jax/configs/default.py")
flags.FLAGS(sys.argv)
from mathrl_jax.sharding import follow_mesh, make_mesh
config = flags.FLAGS.config
sampler = follow_mesh(config.sampler_mesh.to_dict(), config.mesh.to_dict())
print(json.dumps({"mesh": dict(make_mesh(config.mesh.to_dict()).shape),
                  "sampler_mesh": dict(make_mesh(sampler).shape)}))
"""


def run(*argv):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", PROGRAM, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mesh_flags_build_the_mesh_and_the_sampler_mesh_follows():
    shapes = run("--config.mesh.dp=2", "--config.mesh.fsdp=-1", "--config.mesh.tp=2")
    assert shapes["mesh"] == {"dp": 2, "fsdp": 2, "tp": 2}
    assert shapes["sampler_mesh"] == shapes["mesh"]


def test_sampler_mesh_can_differ_from_the_trainer():
    shapes = run(
        "--config.mesh.tp=4",
        "--config.sampler_mesh.tp=1",
        "--config.sampler_mesh.dp=-1",
        "--config.sampler_mesh.fsdp=1",
    )
    assert shapes["mesh"] == {"dp": 1, "fsdp": 2, "tp": 4}
    assert shapes["sampler_mesh"] == {"dp": 8, "fsdp": 1, "tp": 1}
