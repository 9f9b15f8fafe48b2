"""Multi-host start-up, "only one process writes", and host values of global arrays.

Every process of a multi-host job runs the same program on the same host data
(same config, seed and data order). Call `initialize()` first, before any other
JAX call; `jax.devices()` then lists the devices of every host and `make_mesh`
spans them all, so each jitted program runs once over every device, each
process driving its own. Host code reads results through `fetch`, which gathers
the shards other processes hold. Logs, metrics and the run's files are written
by process 0 alone (`is_main_process`, `on_main_process`), the others waiting
at a barrier; Orbax checkpoints are saved and restored by every process together.

A lost process: `jax.distributed`'s coordination service stops hearing its
heartbeats and, after `heartbeat_timeout_s`, aborts every other process with a
log line naming it ("The following tasks are unhealthy (stopped sending
heartbeats): 1"), so no process waits forever at a collective.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable, List, Optional, TypeVar

import jax
import numpy as np

_CLUSTER_ENV = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def initialize(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    *,
    heartbeat_timeout_s: Optional[int] = None,
    join_timeout_s: Optional[int] = None,
) -> bool:
    """Starts `jax.distributed` when this is a multi-process job; returns whether it did.

    The three values come from the arguments, else from the environment
    variables `JAX_COORDINATOR_ADDRESS` (host:port of process 0),
    `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`. With none of them set, a job
    under SLURM, Open MPI or on a Cloud TPU is auto-detected by JAX; otherwise
    this is a single-process run and nothing happens.

    `heartbeat_timeout_s` (default: JAX's, 100 s) bounds how long the other
    processes wait after one is lost before they abort; `join_timeout_s`
    (default: JAX's, 300 s) how long each waits for all to join at start-up.
    """
    env = os.environ
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    count = num_processes if num_processes is not None else env.get("JAX_NUM_PROCESSES")
    index = process_id if process_id is not None else env.get("JAX_PROCESS_ID")
    given = {"coordinator_address": address, "num_processes": count, "process_id": index}
    # CPU hosts exchange data with gloo; GPU and TPU collectives are unaffected by this flag.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = {} if heartbeat_timeout_s is None else {"heartbeat_timeout_seconds": int(heartbeat_timeout_s)}
    if join_timeout_s is not None:
        timeouts["initialization_timeout"] = int(join_timeout_s)
    if all(v is None for v in given.values()):
        if any(name in env for name in _CLUSTER_ENV):
            jax.distributed.initialize(**timeouts)
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
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index, **timeouts)
    _joined["process"] = (index, count)
    return True


_joined: dict = {}  # (process id, count) as given to jax.distributed.initialize


def process_label() -> str:
    """ "process i of n" without starting JAX's backend when `initialize` was given the two numbers.

    A process that stops on bad input names itself with this: starting the backend there (`jax.process_index()`)
    exchanges its topology through process 0's coordination service, and a process 0 that had already stopped on
    the same input made that exchange fail with an abort (SIGABRT) instead of the clean exit 2."""
    index, count = _joined.get("process") or (jax.process_index(), jax.process_count())
    return f"process {index} of {count}"


def hosts_coordinator() -> bool:
    """Whether this is process 0, which hosts jax.distributed's coordination service (as `process_label`, without
    starting JAX's backend when `initialize` was given the numbers)."""
    index, _ = _joined.get("process") or (jax.process_index(), jax.process_count())
    return index == 0


def leave(code: int, message: str, *, program: str, timeout_s: float = 0, leader_grace_s: float = 0) -> None:
    """Ends one process of several at once, printing `program: error (process i of n): message`: exiting normally
    would wait for the others at jax.distributed's shutdown barrier while they wait for this one at their next
    collective. Its heartbeats stop, so a process that did not fail alike is aborted within heartbeat_timeout_s,
    its log naming this one.

    Process 0 hosts the coordination service, whose end aborts every process still connected to it; after bad
    input it lingers `leader_grace_s` (less than the heartbeat timeout) so that the others, stopping on the same
    input a little later, leave with their own exit status rather than that abort.

    After a failure that may be a lost peer's (a collective's connection broke), it first waits up to
    `timeout_s` for jax.distributed's coordination service, which then aborts this process with a line naming
    the lost process ("The following tasks are unhealthy (stopped sending heartbeats): 1").
    """
    import sys
    import time

    print(f"{program}: error ({process_label()}): {message}", file=sys.stderr)
    if timeout_s:
        print(
            f"{program}: waiting up to {timeout_s} s for jax.distributed to name a lost process, if one was lost",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(timeout_s)
    if leader_grace_s and hosts_coordinator():
        time.sleep(leader_grace_s)
    os._exit(code)


def is_main_process() -> bool:
    """True on the process that writes logs, metrics and checkpoint metadata (process 0)."""
    return jax.process_index() == 0


def note(message: str) -> None:
    """`message` on stderr, from the main process alone: every process runs the same program on the same data, so
    a line each would say it once per process."""
    if is_main_process():
        print(message, file=sys.stderr)


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


T = TypeVar("T")


def on_main_process(name: str, fn: Callable[[], T]) -> Optional[T]:
    """Runs `fn` (a write: a file, a directory) on process 0 between two barriers named after `name`: every
    process has arrived (and so read what came before) when it starts, and none goes on before it is done.
    Returns its result on process 0 and None elsewhere. Every process must call it, in the same order.

    The run directory is assumed to be on a file system every process sees (as Orbax assumes for
    checkpoints), so after the barrier the others read what process 0 wrote.
    """
    barrier(f"{name}: before")  # every process is done reading what `fn` may replace
    result = fn() if is_main_process() else None
    barrier(f"{name}: written")
    return result


def fetch(tree: Any) -> Any:
    """The host (numpy) value of every array leaf of `tree`, on every process.

    A leaf sharded over devices of other processes is gathered from them
    (`process_allgather`): a collective, so every process must call `fetch` on
    the same arrays in the same order. Other leaves are read where they are.
    """

    def one(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf

    return jax.tree.map(one, tree)


def allgather_objects(value: Any) -> List[Any]:
    """Every process's JSON-serialisable `value`, in process order (a collective; `[value]` with one process)."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int64(data.size)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:size]).decode()) for row, size in zip(gathered, sizes)]


def process_slice(count: int) -> slice:
    """This process's contiguous share of `count` items (the first `count % process_count` processes take one
    more): work every process could do alike, split so each does its part (e.g. grading)."""
    processes, index = jax.process_count(), jax.process_index()
    base, extra = divmod(count, processes)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def put(tree: Any, shardings: Any) -> Any:
    """`jax.device_put(tree, shardings)`, also across processes for leaves this process holds alone (weights
    just read from a checkpoint, a fresh optimizer count, a PRNG key: the same on every process). Those go
    through host memory, as the CPU backend has no cross-host device transfer."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(leaf, sharding):
        if not isinstance(leaf, jax.Array) or not leaf.is_fully_addressable or sharding.is_fully_addressable:
            return jax.device_put(leaf, sharding)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jax.device_put(np.asarray(jax.random.key_data(leaf)), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        return jax.device_put(np.asarray(leaf), sharding)

    return jax.tree.map(one, tree, shardings)
