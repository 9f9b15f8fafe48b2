"""Every way of running vLLM, on the real engine (its CPU build in CI): `VllmSampler` with one worker in this process
(the params streamed into vLLM's in-place reload), at tensor parallel 2 (two worker processes), and
`VllmServerSampler` against a vLLM server started here. The last two are synced through vLLM's weight-transfer
protocol with the shared-memory engine, in chunks of 100 kB (the tiny model's 3.3 MB in ~40 steps, so a failure can
fall part-way). Each must sample as the `JaxSampler` does on the params just synced, follow every sync (not the
random checkpoint it started from), and never sample from weights a sync left half-done."""

import os
import signal
import subprocess
import sys
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mathrl_jax.sampling import SamplingParams
from tests.sampling.conftest import LOGPROB_ATOL, free_port, logprob_gap, require_vllm

require_vllm()

import requests  # noqa: E402

from mathrl_jax.sampling.vllm import (  # noqa: E402
    ServerError,
    VersionMismatchError,
    VllmSampler,
    VllmServerSampler,
    start_server,
)

CHUNK_BYTES = 100_000


@pytest.fixture(scope="module", params=["in_process", "tensor_parallel", "server"])
def remote(request, warm_tiny, tmp_path_factory):
    """An engine, with a way to read the version it reports."""
    common = dict(
        config=warm_tiny.config,
        eos_token_ids=[warm_tiny.codec.eos_token_id],
        tokenizer=warm_tiny.codec,
        transfer_chunk_bytes=CHUNK_BYTES,
    )
    if request.param in ("in_process", "tensor_parallel"):
        workers = 2 if request.param == "tensor_parallel" else 1
        engine = VllmSampler(warm_tiny.directory, kv_cache_gib=0.25, tensor_parallel_size=workers, **common)
        yield types.SimpleNamespace(
            **vars(warm_tiny), kind=request.param, engine=engine, version=engine.llm.llm_engine.get_weight_version
        )
        engine.close()
        return
    log = str(tmp_path_factory.mktemp("server") / "server.log")
    with start_server(warm_tiny.directory, port=free_port(), log_path=log, kv_cache_gib=0.25) as server:
        engine = VllmServerSampler(server.url, timeout_s=120, **common)
        yield types.SimpleNamespace(
            **vars(warm_tiny),
            kind="server",
            engine=engine,
            server=server,
            common=common,
            version=lambda: requests.get(server.url + "/weight_info", timeout=10).json()["weight_version"],
        )
        engine.close()


def broken(state, layer: int, how: str):
    """`state` whose layer `layer` down-projection fails mid-sync: missing (the trainer's side fails) or of the wrong
    shape (the engine's load fails)."""
    tree = nnx.to_pure_dict(state)
    mlp = tree["model"]["layers"][layer]["mlp"]
    if how == "missing":
        del mlp["down_proj"]
    else:
        mlp["down_proj"]["kernel"] = jnp.zeros((300, mlp["down_proj"]["kernel"].shape[1]))
    return tree


def test_greedy_tokens_and_logprobs_equal_the_jax_samplers_after_a_sync(remote):
    remote.engine.update_weights(remote.state, version=7)
    assert remote.version() == f"7@{remote.engine.tag}"
    params = SamplingParams(temperature=0.0, max_new_tokens=remote.max_new_tokens)
    got = remote.engine.generate(remote.prompts, params)
    want = remote.jax_sampler(remote.state).generate(remote.prompts, params)
    assert got.policy_version == 7
    assert len(got) == len(remote.prompts) == 64
    assert got.completion_ids == want.completion_ids  # every prompt of the batch, exactly
    assert got.finish_reasons == want.finish_reasons and all(r == "stop" for r in got.finish_reasons)
    assert got.stop_reasons == want.stop_reasons
    assert got.texts == want.texts
    for a, b in zip(got.policy_logprobs, want.policy_logprobs):
        np.testing.assert_allclose(a, b, atol=LOGPROB_ATOL)
    if remote.kind == "server":
        assert remote.engine.bytes_sent == 3256832  # the tiny model's float32 tensors, every one once


def test_the_engine_follows_each_of_several_syncs(remote):
    """The engine started from the random checkpoint on disk. Synced the warm-started params, those params three
    optimizer steps on, then the random ones: each time its sampled log-probs (temperature 1) are the trainer's for
    the params just synced, and far from the others'."""
    states = {"warm": remote.state, "stepped": remote.stepped, "random": remote.random_state}
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=5)
    for version, name in enumerate(states, start=10):
        remote.engine.update_weights(states[name], version=version)
        rollouts = remote.engine.generate(remote.prompts[:16], params)
        assert rollouts.policy_version == version
        gaps = {other: logprob_gap(remote, state, rollouts) for other, state in states.items()}
        assert gaps[name] < LOGPROB_ATOL, (name, gaps)
        assert all(gap > 100 * LOGPROB_ATOL for other, gap in gaps.items() if other != name), (name, gaps)
        np.testing.assert_array_equal(  # at temperature 1 the sampled-from log-probs are the policy's
            np.concatenate(rollouts.logprobs), np.concatenate(rollouts.policy_logprobs)
        )
    assert remote.engine.generate(remote.prompts[:16], params).completion_ids == rollouts.completion_ids  # seeded
    assert np.isfinite(remote.engine.last_sync_seconds) and remote.engine.last_sync_seconds > 0


@pytest.mark.parametrize("how", ["missing", "wrong shape"])
def test_a_sync_that_fails_part_way_is_never_sampled_from(remote, how):
    """A sync that stops part-way (the trainer's side: a tensor it cannot produce; the engine's: one it cannot
    take) leaves the engine saying `incomplete:<version>` and the sampler refusing to sample; the next sync works,
    and the engine samples the params it brought."""
    remote.engine.update_weights(remote.random_state, version=20)
    if how == "missing":  # raised in this process, whichever engine
        expected = pytest.raises(KeyError, match="down_proj")
    else:  # the engine's loader refused the shape: in this process, from a worker process, or over HTTP
        error = ServerError if remote.kind == "server" else RuntimeError
        expected = pytest.raises(error, match="exceeds dimension size")
    with expected:
        remote.engine.update_weights(broken(remote.state, 1, how), version=21)
    assert remote.version() == f"incomplete:21@{remote.engine.tag}"
    with pytest.raises(RuntimeError, match="holds no weights this sampler synced"):
        remote.engine.generate(remote.prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    remote.engine.update_weights(remote.state, version=22)
    params = SamplingParams(temperature=0.0, max_new_tokens=remote.max_new_tokens)
    got = remote.engine.generate(remote.prompts[:16], params)
    assert got.policy_version == 22
    assert got.completion_ids == remote.jax_sampler(remote.state).generate(remote.prompts[:16], params).completion_ids


@pytest.mark.parametrize("remote", ["server"], indirect=True)
def test_weights_synced_by_another_client_are_detected(remote):
    """Two trainers on one server, both at version 30: the second's sync changes the weights under the first, whose
    next generate raises instead of returning rollouts of another policy (the labels carry each sampler's tag)."""
    remote.engine.update_weights(remote.state, version=30)
    other = VllmServerSampler(remote.server.url, timeout_s=120, **remote.common)
    try:
        other.update_weights(remote.random_state, version=30)
        with pytest.raises(VersionMismatchError, match=f"\\['30@{other.tag}'\\], not '30@{remote.engine.tag}'"):
            remote.engine.generate(remote.prompts[:4], SamplingParams(temperature=0.0, max_new_tokens=8))
    finally:
        other.close()
    remote.engine.update_weights(remote.state, version=32)
    assert remote.engine.generate(remote.prompts[:4], SamplingParams(max_new_tokens=4, seed=0)).policy_version == 32


class Meddles:
    """A kernel whose conversion, half-way through a sync, lets another client label the engine as its own sync
    would (as a second trainer starting to sync the same server), then yields the real kernel."""

    def __init__(self, kernel, meddle):
        self.kernel, self.meddle = kernel, meddle

    @property
    def T(self):
        self.meddle()
        return self.kernel.T


@pytest.mark.parametrize("remote", ["server"], indirect=True)
def test_a_sync_another_client_started_meanwhile_is_not_labelled_as_ours(remote):
    """Another client labelling the engine during our sync (its own sync begun): ours raises before it labels the
    mixture as its version, and the engine keeps the other's `incomplete:` label, which no sampler samples."""
    other = VllmServerSampler(remote.server.url, timeout_s=120, **remote.common)
    tree = nnx.to_pure_dict(remote.state)
    down = tree["model"]["layers"][1]["mlp"]["down_proj"]
    down["kernel"] = Meddles(down["kernel"], lambda: other._set_engine_version(f"incomplete:35@{other.tag}"))
    try:
        with pytest.raises(VersionMismatchError, match="synced by another client during this sync of version 34"):
            remote.engine.update_weights(tree, version=34)
    finally:
        other.close()
    assert remote.version() == f"incomplete:35@{other.tag}"
    with pytest.raises(RuntimeError, match="holds no weights this sampler synced"):
        remote.engine.generate(remote.prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    remote.engine.update_weights(remote.state, version=36)
    assert remote.engine.generate(remote.prompts[:4], SamplingParams(max_new_tokens=4, seed=0)).policy_version == 36


TRAINER_DIES_MID_SYNC = """
import os, sys
from flax import nnx
from mathrl_jax.models import hf
from mathrl_jax.sampling.vllm import VllmServerSampler

class Dies:  # the tensor the sync reaches half-way: the trainer process ends there, its session left open
    @property
    def T(self):
        os._exit(3)

model = hf.load_model(sys.argv[2])
tree = nnx.to_pure_dict(nnx.state(model))
tree["model"]["layers"][1]["mlp"]["down_proj"]["kernel"] = Dies()
sampler = VllmServerSampler(sys.argv[1], config=model.config, transfer_chunk_bytes=100_000)
sampler.update_weights(tree, version=41)
"""


@pytest.mark.parametrize("remote", ["server"], indirect=True)
def test_a_trainer_killed_mid_sync_leaves_a_server_the_next_one_can_sync(remote, tmp_path):
    """A trainer process that dies half-way through a sync leaves the server paused, its update session open and its
    version `incomplete:41`: no client samples those weights (a request waits, and times out naming the server),
    and the next trainer's sync closes the session, loads every weight and resumes the server."""
    script = tmp_path / "dies.py"
    script.write_text(TRAINER_DIES_MID_SYNC)
    done = subprocess.run(
        [sys.executable, str(script), remote.server.url, remote.directory],
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert remote.version().startswith("incomplete:41@")
    assert requests.get(remote.server.url + "/is_paused", timeout=10).json()["is_paused"]
    remote.engine.expect_weights(40)  # as another process of a run whose process 0 synced version 40 believes
    remote.engine.timeout_s = 3.0
    try:
        with pytest.raises(ServerError, match="did not answer generation request 0 within 3 s"):
            remote.engine.generate(remote.prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=4))
    finally:
        remote.engine.timeout_s = 120.0
    remote.engine.update_weights(remote.state, version=42)
    assert not requests.get(remote.server.url + "/is_paused", timeout=10).json()["is_paused"]
    params = SamplingParams(temperature=0.0, max_new_tokens=remote.max_new_tokens)
    got = remote.engine.generate(remote.prompts[:16], params)
    assert got.policy_version == 42
    assert got.completion_ids == remote.jax_sampler(remote.state).generate(remote.prompts[:16], params).completion_ids


@pytest.mark.parametrize("remote", ["server"], indirect=True)
def test_a_server_that_does_not_answer_is_named_within_the_timeout(remote):
    """A server alive but silent (SIGSTOP): a generate and a sync each stop within the timeout, naming it; once it
    answers again, a sync brings it back."""
    remote.engine.update_weights(remote.state, version=50)
    remote.engine.timeout_s = 3.0
    os.kill(remote.server.process.pid, signal.SIGSTOP)
    try:
        for attempt in (
            lambda: remote.engine.generate(remote.prompts[:4], SamplingParams(temperature=0.0, max_new_tokens=4)),
            lambda: remote.engine.update_weights(remote.state, version=51),
        ):
            start = time.monotonic()
            with pytest.raises(ServerError, match=f"the vLLM server at {remote.server.url} did not answer .* 3 s"):
                attempt()
            assert time.monotonic() - start < 30
    finally:
        os.kill(remote.server.process.pid, signal.SIGCONT)
        remote.engine.timeout_s = 120.0
    remote.engine.update_weights(remote.state, version=52)
    assert remote.engine.generate(remote.prompts[:4], SamplingParams(max_new_tokens=4, seed=1)).policy_version == 52
