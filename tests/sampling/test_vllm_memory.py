"""The KV cache asked of vLLM's CPU build against the host's memory (sampling/vllm/memory.py): a refusal names the
option and a size that the same check then takes; a machine without room for the smallest is told to use the JAX
sampler; a cache that fits is not refused."""

import re

import pytest

from mathrl_jax.sampling.vllm.memory import SHARE, available_host_gib, kv_cache_refusal


@pytest.mark.parametrize("asked, workers, available", [(20.0, 1, 22.0), (4.0, 2, 6.0), (1.0, 2, 1.0), (2.0, 1, 3.9)])
def test_the_size_a_refusal_suggests_is_taken(asked, workers, available):
    refusal = kv_cache_refusal(asked, workers, available)
    assert refusal.startswith(f"vllm.kv_cache_gib={asked:g} asks vLLM's CPU build for {asked * workers:g} GiB")
    suggested = float(re.search(r"--config\.vllm\.kv_cache_gib=([\d.]+)", refusal).group(1))
    assert 0.25 <= suggested <= 1.0 and suggested * workers <= SHARE * available
    assert kv_cache_refusal(suggested, workers, available) is None


def test_a_machine_without_room_for_the_smallest_cache_is_told_to_use_the_jax_sampler():
    refusal = kv_cache_refusal(0.25, 4, 1.0)
    assert "use --config.sampler=jax" in refusal and "kv_cache_gib=0.25" in refusal


def test_a_cache_that_fits_is_taken_and_the_host_is_read():
    assert kv_cache_refusal(0.25, 1, 2.0) is None
    available = available_host_gib()
    assert available is None or available > 0
