"""Multi-host start-up and "only one process writes" helpers.

Every process of a multi-host job runs the same program. Call `initialize()`
first, before any other JAX call; `jax.devices()` then lists the devices of
every host and `make_mesh` spans them all. Logs, metrics and checkpoint
metadata are written by process 0 alone (`is_main_process`,
`main_process_only`).
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Optional

import jax

_CLUSTER_ENV = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def initialize(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
) -> bool:
    """Starts `jax.distributed` when this is a multi-process job; returns whether it did.

    The three values come from the arguments, else from the environment
    variables `JAX_COORDINATOR_ADDRESS` (host:port of process 0),
    `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`. With none of them set, a job
    under SLURM, Open MPI or on a Cloud TPU is auto-detected by JAX; otherwise
    this is a single-process run and nothing happens.
    """
    env = os.environ
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    count = num_processes if num_processes is not None else env.get("JAX_NUM_PROCESSES")
    index = process_id if process_id is not None else env.get("JAX_PROCESS_ID")
    given = {"coordinator_address": address, "num_processes": count, "process_id": index}
    # CPU hosts exchange data with gloo; GPU and TPU collectives are unaffected by this flag.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if all(v is None for v in given.values()):
        if any(name in env for name in _CLUSTER_ENV):
            jax.distributed.initialize()
            return True
        return False
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(
            f"multi-host start-up needs coordinator_address, num_processes and process_id; "
            f"missing {', '.join(missing)} (flags or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID)"
        )
    count, index = int(count), int(index)
    if not 0 <= index < count:
        raise ValueError(f"process_id={index} is outside [0, num_processes={count})")
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)
    return True


def is_main_process() -> bool:
    """True on the process that writes logs, metrics and checkpoint metadata (process 0)."""
    return jax.process_index() == 0


def main_process_only(fn: Callable) -> Callable:
    """Decorates a function with side effects (a log line, a file) to run on process 0 only."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if is_main_process():
            return fn(*args, **kwargs)
        return None

    return wrapper


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
