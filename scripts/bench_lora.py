"""LoRA against full fine-tuning at a real shape: the update's memory and time, and how the adapters reach each sampler
(applied in the JAX sampler's passes or merged into its weights; vLLM's own LoRA or merged weights).

The code is `benchmarks/lora.py` (importable: `from benchmarks.lora import main`); this file is its
command line.
`python scripts/bench_lora.py --help` lists the options.
"""

import os
import sys

# The repository root, so that `benchmarks` imports from a clone that is not installed (as the GPU image runs it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.lora import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
