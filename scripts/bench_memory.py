"""Memory and compile time of one GRPO update step at a real shape, and one real step where it fits.

The code is `benchmarks/memory.py` (importable: `from benchmarks.memory import main`); this file is its
command line.
`python scripts/bench_memory.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.memory import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
