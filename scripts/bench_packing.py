"""Packed against padded: the GRPO update and the log-prob pass at a realistic spread of response lengths.

The code is `benchmarks/packing.py` (importable: `from benchmarks.packing import main`); this file is its
command line.
`python scripts/bench_packing.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.packing import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
