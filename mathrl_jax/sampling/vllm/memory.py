"""Whether the KV cache asked of vLLM's CPU build fits in this machine's memory, said before the engine starts.

vLLM's CPU build allocates `kv_cache_memory_bytes` of host memory per worker; asked for more than the machine
has, it dies in its own words (~80 lines ending "requested memory for kv (20.0 GiB)", exit 1) after the model
loaded. `kv_cache_refusal` says so first, in one line naming the option and a size that fits. Host memory is read
from the kernel (`/proc/meminfo`'s MemAvailable: free memory plus what the page cache gives back), falling back to
`os.sysconf`'s free pages where there is no /proc (macOS); written here because the standard library has no
"available memory" and psutil is not a dependency.
"""

from __future__ import annotations

import math
import os
from typing import Optional

GIB = 1 << 30
SHARE = 0.5
"""The most of the available memory the KV caches may take: the trainer, the model's copies in the engine and the
graders need the rest."""


def available_host_gib() -> Optional[float]:
    """Host memory available to a new allocation, in GiB (None where the system does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def kv_cache_refusal(kv_cache_gib: float, workers: int = 1, available_gib: Optional[float] = None) -> Optional[str]:
    """The one line refusing `kv_cache_gib` per worker on vLLM's CPU build, or None when `workers` caches fit in
    SHARE of the available host memory (`available_gib`, read now when None)."""
    available = available_host_gib() if available_gib is None else available_gib
    if available is None or kv_cache_gib * workers <= SHARE * available:
        return None
    fits = math.floor(SHARE * available / workers * 4) / 4  # GiB per worker, in quarters
    asked = (
        f"vllm.kv_cache_gib={kv_cache_gib:g} asks vLLM's CPU build for {kv_cache_gib * workers:g} GiB of host memory "
        f"({workers} worker(s)), but this machine has {available:.1f} GiB available"
    )
    if fits < 0.25:
        return f"{asked}: too little for vLLM's CPU build here; use --config.sampler=jax (docs/vllm.md)"
    return f"{asked}: use --config.vllm.kv_cache_gib={min(fits, 1.0):g} (at most {fits:g} fits; docs/vllm.md)"
