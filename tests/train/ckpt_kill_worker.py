"""Subprocess for the crash test: saves step 1, starts an asynchronous save of step 2, and
says so; the test SIGKILLs it while step 2 is being written.

    python ckpt_kill_worker.py DIRECTORY

`make_state` is shared with the test, which rebuilds the expected step-1 state from it.
"""

import sys

import numpy as np

LEAVES = 16
LEAF_SIZE = 1 << 20  # 16 x 4 MiB of params + as much momentum: long enough to write that a kill lands mid-write


def make_state(step: int) -> dict:
    """A deterministic TrainState-like tree for `step` (random values, which do not compress)."""
    rng = np.random.default_rng(step)
    params = {f"w{i}": rng.standard_normal(LEAF_SIZE, dtype=np.float32) for i in range(LEAVES)}
    momentum = {f"w{i}": rng.standard_normal(LEAF_SIZE, dtype=np.float32) for i in range(LEAVES)}
    return {
        "params": params,
        "opt_state": {"count": np.int32(step), "mu": momentum},
        "rng": rng.integers(0, 2**32, size=(2,), dtype=np.uint32),
        "step": step,
    }


def main(directory: str) -> None:
    import jax

    from mathrl_jax.train.checkpoint._checkpointer import Checkpointer

    def on_device(state):
        return jax.tree.map(lambda x: jax.numpy.asarray(x) if isinstance(x, np.ndarray) else x, state)

    checkpointer = Checkpointer(directory, save_interval=1, max_to_keep=3, async_save=True)
    checkpointer.save(1, on_device(make_state(1)), {"data_position": 10})
    checkpointer.wait_until_finished()
    print("SAVED 1", flush=True)
    checkpointer.save(2, on_device(make_state(2)), {"data_position": 20})
    print("SAVING 2", flush=True)  # save() returned: the background thread is writing step 2
    checkpointer.wait_until_finished()
    print("SAVED 2", flush=True)  # only reached when the kill came too late


if __name__ == "__main__":
    main(sys.argv[1])
