"""`scripts/train.py`, with process 1 reaching its data 2 s after process 0: an order a loaded machine gives
by chance (CI's did), made certain so the test of stopping on bad input together sees it every time."""

import os
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "scripts", "train.py")

from mathrl_jax.train.setup import _inputs  # noqa: E402  (imports start no JAX backend; the build's first phase)

if os.environ.get("JAX_PROCESS_ID") == "1":
    read = _inputs.load_data

    def late(config):
        time.sleep(2)
        return read(config)

    _inputs.load_data = late

sys.argv = [TRAIN, *sys.argv[1:]]
runpy.run_path(TRAIN, run_name="__main__")
