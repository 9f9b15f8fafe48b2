"""Test-wide settings.

Multi-device tests need simulated CPU devices before jax is imported, so the
flag is set here, at collection time, for the whole session.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No test reaches the Hugging Face Hub: a Hub id resolves from the local cache only (models/hub.py), in this process
# and in every script it starts. Tests of downloads set HF_HUB_OFFLINE=0 and HF_ENDPOINT to a local stand-in
# (tests/models/hub_server.py) for their own subprocesses.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The scripts the tests run keep JAX's persistent compilation cache under $XDG_CACHE_HOME: a directory of this
# test session (inherited by every subprocess), never the user's ~/.cache.
_CACHE_HOME = tempfile.mkdtemp(prefix="mathrl_jax_tests_cache_")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
atexit.register(shutil.rmtree, _CACHE_HOME, ignore_errors=True)

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
