"""The testbed's predictions (docs/testbed.md), each checked against the sweeps that test it: held or failed.

The code is `benchmarks/testbed_report.py` (importable: `from benchmarks.testbed_report import main`); this file is its
command line.
`python scripts/testbed_report.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.testbed_report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
