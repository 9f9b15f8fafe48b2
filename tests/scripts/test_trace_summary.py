"""`benchmarks.trace_summary` reads a real `jax.profiler` trace: a matmul program's device time is matmuls, an
elementwise program's is not, host sleeps between calls show as idle time, and the busy time is the union of the
ops' intervals."""

import gzip
import json
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
    return trace_summary.summarize(str(tmp_path), "cpu")


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


def gpu_trace(tmp_path, with_gpu=True):
    """A trace laid out as XLA's GPU profiler writes it: the kernels on a `/device:GPU:0` process's stream thread,
    repeated on its derived "XLA Ops" line, and host events that also name HLO ops (the launches)."""
    meta = [
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "tid": 20, "name": "thread_name", "args": {"name": "tf_XLAPjRtGpuClient"}},
    ]
    kernels = [  # (start, duration, kernel, op)
        (0, 40, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "custom-call.1"),
        (40, 30, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "custom-call.2"),
        (70, 10, "loop_multiply_fusion", "loop_multiply_fusion.3"),
        (100, 20, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "custom-call.4"),
    ]
    events = []
    if with_gpu:
        meta += [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0 NVIDIA H200"}},
            {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Kernel)"}},
            {"ph": "M", "pid": 1, "tid": 100, "name": "thread_name", "args": {"name": "XLA Ops"}},
        ]
        for start, duration, kernel, op in kernels:
            for tid, name in ((7, kernel), (100, op)):
                args = {"hlo_op": op, "hlo_module": "jit_update"}
                events.append(
                    {"ph": "X", "pid": 1, "tid": tid, "ts": start, "dur": duration, "name": name, "args": args}
                )
    for start, _, _, op in kernels:  # the host's launches, a microsecond each
        events.append({"ph": "X", "pid": 2, "tid": 20, "ts": start, "dur": 1, "name": op, "args": {"hlo_op": op}})
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": meta + events}, f)
    return str(tmp_path)


def test_a_gpu_trace_counts_the_stream_kernels_once_and_not_the_host(tmp_path):
    summary = trace_summary.summarize(gpu_trace(tmp_path), "gpu")
    assert summary["ops"] == 4  # the stream's kernels; not their "XLA Ops" copies, not the host's launches
    assert summary["seconds_by_class"] == pytest.approx({"matmul": 60e-6, "attention": 30e-6, "other": 10e-6})
    assert summary["window_seconds"] == pytest.approx(120e-6) and summary["busy_seconds"] == pytest.approx(100e-6)
    assert summary["idle_fraction"] == pytest.approx(20 / 120)
    assert summary["top_kernels"][0] == {
        "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "seconds": pytest.approx(60e-6), "class": "matmul"
    }  # fmt: skip


def test_a_gpu_trace_without_device_events_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no /device:GPU process"):
        trace_summary.summarize(gpu_trace(tmp_path, with_gpu=False), "gpu")
