"""Benchmark of the JAX Qwen model against PyTorch `transformers`, in one run.

The code is `benchmarks/model.py` (importable: `from benchmarks.model import main`); this file is its
command line.
`python scripts/bench_model.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.model import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
