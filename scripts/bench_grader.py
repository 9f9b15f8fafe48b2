"""Benchmark of the math grader on a batch like the offline default's.

The code is `benchmarks/grader.py` (importable: `from benchmarks.grader import main`); this file is its
command line.
`python scripts/bench_grader.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.grader import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
