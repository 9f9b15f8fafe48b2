"""Where a program's device time goes, read from a `jax.profiler` trace: matmuls, attention, the rest, and idle.

`jax.profiler.trace(log_dir, create_perfetto_trace=True)` writes the trace as Chrome-trace JSON
(`perfetto_trace.json.gz`). Each XLA operation executed on a device is an event that names its HLO op
(`args.hlo_op`): on a GPU one event per kernel, on the streams of the `/device:GPU:N` process; on a CPU one per
thunk, on the `/host:CPU` process's XLA client thread. `summarize` sums their durations by class and measures the
device's idle time between the first and last of them (host gaps: launches, Python, transfers).

The classes are read off the kernel and op names, for a reader deciding what holds the MFU: `matmul` (cuBLAS /
cuBLASLt / CUTLASS / Triton GEMM kernels, XLA dot thunks, YNNPACK's dots on a CPU), `attention` (cuDNN's fused
attention, flash kernels), `other` (fusions, reductions, copies, the optimizer's elementwise update). The
patterns are names, not a contract: the top kernels are listed beside the classes so a misread shows.

Written here because the trace tooling that reads these files (TensorBoard's profile plugin, xprof) is not in
this project's dependencies or on the lent GPU's image; the file format is Chrome's trace-event JSON.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

MATMUL = re.compile(r"gemm|xmma|cutlass|nvjet|cublas|\bdot\b|dot[._-]|_dot|ynn|matmul|wgmma|hmma", re.IGNORECASE)
ATTENTION = re.compile(r"sdpa|fmha|flash|attention|attn", re.IGNORECASE)
TOP = 15  # kernels listed by total time


def trace_file(log_dir: str) -> str:
    """The newest `perfetto_trace.json.gz` under `log_dir` (jax.profiler writes plugins/profile/<time>/)."""
    found = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {log_dir} (trace with create_perfetto_trace=True)")
    return max(found, key=os.path.getmtime)


def classify(name: str) -> str:
    """ "attention", "matmul" or "other" for a kernel or op name (attention first: cuDNN's kernels hold GEMMs)."""
    if ATTENTION.search(name):
        return "attention"
    if MATMUL.search(name):
        return "matmul"
    return "other"


def device_events(events: list, platform: str) -> list:
    """(start us, duration us, kernel name, HLO op) of each XLA op run on a device: on platform "gpu", the kernels on
    the GPU's stream threads (none there, as without CUPTI, is an error, not the host's events counted instead);
    else the ops on the CPU's XLA client threads."""
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e["pid"], e.get("tid")] = e["args"]["name"]
    gpus = {pid for pid, name in processes.items() if name.startswith("/device:GPU")}
    if platform == "gpu" and not gpus:
        raise ValueError(f"a GPU run's trace has no /device:GPU process (processes: {sorted(processes.values())})")
    chosen = []
    for e in events:
        if e.get("ph") != "X" or "hlo_op" not in e.get("args", {}) or e["name"].startswith("end: "):
            continue
        thread = threads.get((e["pid"], e.get("tid")), "")
        if platform == "gpu":
            # the stream lines hold the kernels; derived lines ("XLA Ops", "XLA Modules") repeat them
            if e["pid"] not in gpus or not thread.startswith("Stream"):
                continue
        elif not processes.get(e["pid"], "").startswith("/host:CPU"):
            continue
        chosen.append((float(e["ts"]), float(e.get("dur", 0.0)), e["name"], e["args"]["hlo_op"]))
    return chosen


def busy_time(intervals: list) -> float:
    """The length of the union of (start, duration) intervals: time the device ran at least one op."""
    total, end = 0.0, float("-inf")
    for start, duration in sorted(intervals):
        stop = start + duration
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize(log_dir: str, platform: str) -> dict:
    """Seconds of device time by class, busy and idle seconds over the traced window, and the kernels that took
    the most time in all (instances of a kernel summed)."""
    with gzip.open(trace_file(log_dir)) as f:
        data = json.load(f)
    events = device_events(data["traceEvents"] if isinstance(data, dict) else data, platform)
    if not events:
        raise ValueError(f"no device op events in the trace under {log_dir}")
    by_class, by_kernel, kernel_class = {"matmul": 0.0, "attention": 0.0, "other": 0.0}, {}, {}
    for _, duration, kernel, op in events:
        kind = classify(f"{kernel} {op}")
        by_class[kind] += duration
        kernel = re.sub(r"\.\d+$", "", kernel)  # a CPU thunk is named after its op ("ynn_fusion.176")
        by_kernel[kernel] = by_kernel.get(kernel, 0.0) + duration
        kernel_class.setdefault(kernel, {}).setdefault(kind, 0.0)
        kernel_class[kernel][kind] += duration
    window = max(s + d for s, d, _, _ in events) - min(s for s, _, _, _ in events)
    busy = busy_time([(s, d) for s, d, _, _ in events])
    kernel_time = sum(by_class.values())
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:TOP]
    return {
        "ops": len(events),
        "window_seconds": window / 1e6,
        "busy_seconds": busy / 1e6,
        "idle_fraction": 1.0 - busy / window if window else 0.0,
        "seconds_by_class": {k: v / 1e6 for k, v in by_class.items()},
        "share_by_class": {k: v / kernel_time for k, v in by_class.items()} if kernel_time else {},
        "top_kernels": [
            {"name": k[:200], "seconds": t / 1e6, "class": max(kernel_class[k], key=kernel_class[k].get)}
            for k, t in top
        ],
    }
