"""The GPU report: what one lent GPU measures of mathrl_jax in one run, each step under its own time budget.

The code is `benchmarks/gpu.py` (importable: `from benchmarks.gpu import main`); this file is its
command line.
`python scripts/bench_gpu.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
