"""Peak host memory of loading a Hugging Face checkpoint into a sharded state.

The code is `benchmarks/sharded_load.py` (importable: `from benchmarks.sharded_load import main`); this file is its
command line.
`python scripts/bench_sharded_load.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sharded_load import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
