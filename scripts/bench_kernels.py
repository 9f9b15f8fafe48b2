"""The kernels of one Qwen forward+backward, JAX against torch, one at a time.

The code is `benchmarks/kernels.py` (importable: `from benchmarks.kernels import main`); this file is its
command line.
`python scripts/bench_kernels.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.kernels import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
