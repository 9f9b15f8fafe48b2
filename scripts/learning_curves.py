"""Learning curves over seeds: the RL run and its control (shuffled rewards), as a PNG and a markdown table.

The code is `benchmarks/learning_curves.py` (importable: `from benchmarks.learning_curves import main`); this file
is its command line.
`python scripts/learning_curves.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.learning_curves import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
