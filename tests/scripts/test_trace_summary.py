"""`benchmarks.trace_summary` reads a real `jax.profiler` trace: a matmul program's device time is matmuls, an
elementwise program's is not, host sleeps between calls show as idle time, and the busy time is the union of the
ops' intervals."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import trace_summary


def traced(tmp_path, fn, args, calls=3, pause=0.0):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))  # compiled outside the trace
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(calls):
            jax.block_until_ready(fn(*args))
            time.sleep(pause)
    return trace_summary.summarize(str(tmp_path))


def test_a_matmul_program_is_matmul_time_and_an_elementwise_one_is_not(tmp_path):
    a = jnp.ones((768, 768), jnp.float32)
    matmuls = traced(tmp_path / "dot", lambda a: (a @ a) @ a, (a,))
    assert matmuls["ops"] >= 3 and matmuls["share_by_class"]["matmul"] > 0.8, matmuls
    big = jnp.ones((4096, 2048), jnp.float32)
    elementwise = traced(tmp_path / "ew", lambda x: jnp.tanh(jnp.exp(jnp.sin(x)) * 2.0).sum(0), (big,))
    assert elementwise["share_by_class"]["matmul"] < 0.2, elementwise
    top = matmuls["top_kernels"][0]
    assert top["class"] == "matmul" and top["seconds"] <= matmuls["busy_seconds"] + 1e-9


def test_host_pauses_between_calls_are_idle_device_time(tmp_path):
    a = jnp.ones((512, 512), jnp.float32)
    back_to_back = traced(tmp_path / "busy", lambda a: a @ a @ a, (a,), calls=4)
    paused = traced(tmp_path / "paused", lambda a: a @ a @ a, (a,), calls=4, pause=0.2)
    assert paused["idle_fraction"] > max(0.5, back_to_back["idle_fraction"]), (paused, back_to_back)
    assert paused["window_seconds"] > 0.6  # three pauses of 0.2 s lie between the first op and the last


def test_busy_time_is_the_union_of_the_intervals():
    rng = np.random.default_rng(0)
    for _ in range(20):
        starts = rng.integers(0, 1000, 30)
        durations = rng.integers(0, 80, 30)
        covered = np.zeros(1100, bool)
        for s, d in zip(starts, durations):
            covered[s : s + d] = True
        assert trace_summary.busy_time(list(zip(starts.tolist(), durations.tolist()))) == covered.sum()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64 [custom-call.3]", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT [gemm_fusion.2]", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16 [custom-call.7]", "attention"),
        ("loop_multiply_fusion [loop_multiply_fusion.4]", "other"),
        ("input_reduce_fusion [reduce.12]", "other"),
    ],
)
def test_gpu_kernel_names_are_classed(name, expected):
    assert trace_summary.classify(name) == expected
