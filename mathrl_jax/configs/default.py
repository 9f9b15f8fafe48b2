"""The default configuration.

Pass it to a script with `--config mathrl_jax/configs/default.py` and override
any field from the command line, e.g. `--config.mesh.tp=2`.
"""

import ml_collections


def mesh_config(dp: int = 1, fsdp: int = -1, tp: int = 1) -> ml_collections.ConfigDict:
    """A mesh: dp x fsdp x tp devices; one of them may be -1, "the rest of the devices"."""
    return ml_collections.ConfigDict({"dp": dp, "fsdp": fsdp, "tp": tp})


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The trainer's mesh. One GPU: the defaults. One host with 8 GPUs: e.g. fsdp=-1 or
    # fsdp=4 tp=2. Several hosts: the same flags, over the devices of all hosts.
    config.mesh = mesh_config()
    # The sampler's mesh: an axis left unset follows the trainer's. E.g. data-parallel
    # decoding beside a tensor-parallel trainer: --config.sampler_mesh.dp=-1
    # --config.sampler_mesh.fsdp=1 --config.sampler_mesh.tp=1.
    config.sampler_mesh = ml_collections.ConfigDict(
        {axis: ml_collections.config_dict.placeholder(int) for axis in ("dp", "fsdp", "tp")}
    )
    return config
