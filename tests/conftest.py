"""Test-wide settings.

Multi-device tests need simulated CPU devices before jax is imported, so the
flag is set here, at collection time, for the whole session.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

# Every example of a jitted function may compile: keep the example count modest
# and drop the per-example deadline (compile time is not the property under test).
settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
