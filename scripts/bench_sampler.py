"""Decode throughput of `JaxSampler` and vLLM (`VllmSampler`) against `transformers` `generate`, in one run, and the
JAX-to-vLLM weight sync time.

The code is `benchmarks/sampler.py` (importable: `from benchmarks.sampler import main`); this file is its
command line.
`python scripts/bench_sampler.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sampler import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
