"""scripts/bench_gpu.py --smoke (CPU, tiny shapes): every step runs and reports finite numbers that fit together
(MFU from the two steps' rates, tokens/s ratios, the sync's copies, an iteration's split within its time); the
report on disk is rewritten after each step while the run goes on, so a killed run leaves the finished steps; a
step that raises, or runs over its budget, is recorded as failed with its error and the next step still runs."""

import json
import math
import os
import subprocess
import sys
import time

import pytest

from mathrl_jax.models import attention, hf, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench_gpu.py")
STEPS = ["matmul", "update", "attention", "sampler", "sync", "grpo"]
ENV = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
SIGNED = {"loss"}  # the policy loss has either sign
ZERO = {"skipped_updates"}  # a finite step is never skipped
COUNTS = {"copies", "copied_bytes", "largest_copy_bytes", "cache_hits", "cache_misses"}  # 0 where none


def numbers(value, key=""):
    """(key, number) for every number in a nested JSON value (booleans are not numbers here)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from numbers(v, key)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, value


def test_smoke_runs_every_step_and_rewrites_the_report_after_each(tmp_path):
    out, log = tmp_path / "out", tmp_path / "stdout.txt"
    report_path = out / "bench_gpu.json"
    with open(log, "w") as stdout:
        process = subprocess.Popen(
            [sys.executable, SCRIPT, "--smoke", "--attention", "xla", "--scan-layers", "--out", str(out)],
            cwd=ROOT,
            env=ENV,
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
        snapshots, deadline = {}, time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            try:  # written through a temporary file and a rename: never seen half-written
                seen = json.loads(report_path.read_text())
            except FileNotFoundError:
                seen = None
            if seen and seen["running"]:
                snapshots.setdefault(seen["running"]["step"], seen)
            time.sleep(0.05)
        process.kill()
        returncode = process.wait()
    text = log.read_text()
    assert returncode == 0, text[-3000:]

    # While step k ran, the report on disk held steps 1 .. k-1, finished: what a run killed then leaves.
    assert sorted(snapshots) == sorted(STEPS), sorted(snapshots)
    for name, seen in snapshots.items():
        assert not seen["complete"] and list(seen["steps"]) == STEPS[: STEPS.index(name)]
        assert all(r["status"] == "ok" for r in seen["steps"].values())

    report = json.loads(report_path.read_text())
    assert report["complete"] and report["running"] is None and list(report["steps"]) == STEPS
    assert report["xla_settings"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    steps = report["steps"]
    for name, r in steps.items():
        assert r["status"] == "ok" and r["error"] is None, (name, r)
        assert 0 < r["seconds"] <= r["budget_s"] + 5
        for key, value in numbers(r):
            assert math.isfinite(value), (name, key, value)
            if key in ZERO:
                assert value == 0, (name, key)
            elif key in COUNTS:
                assert value >= 0, (name, key)
            elif key not in SIGNED:
                assert value > 0, (name, key, value)

    update, matmul = steps["update"], steps["matmul"]
    assert update["attention"] == steps["grpo"]["attention"] == "xla"  # --attention reached both steps
    assert update["scan_layers"] is True and steps["grpo"]["scan_layers"] is True
    assert update["tokens"] == update["rows"] * update["length"]
    assert update["flops_per_step"] == 6 * update["params"] * update["tokens"]
    assert math.isclose(update["tflops"], update["flops_per_step"] / update["median_seconds"] / 1e12)
    assert math.isclose(update["mfu"], update["tflops"] / matmul["tflops"])
    assert len(update["seconds_per_step"]) == 2 and len(matmul["seconds_per_matmul"]) == 3

    # The smoke run's attention implementations (the CPU has no cuDNN) each timed, none failed.
    assert sorted(steps["attention"]["implementations"]) == ["blocked", "xla"]
    assert all("error" not in x for x in steps["attention"]["implementations"].values())

    assert sorted(steps["sampler"]["batches"]) == ["2", "4"]
    for batch, b in steps["sampler"]["batches"].items():
        if batch == "2":  # above the smoke run's sampler_torch_max_batch (2), no transformers baseline
            assert math.isclose(b["ratio"], b["jax_tokens_per_second"] / b["transformers_tokens_per_second"])
        assert 0 < b["bandwidth_fraction"]

    # Every tensor of the float32 params is a cast (a copy); of the bfloat16 params, only the transposed kernels.
    table = hf.parameter_table(tiny_config())
    transposed = sum(spec.transpose for spec in table.values())
    cases = steps["sync"]["cases"]
    assert cases["float32 params -> bfloat16"]["tensors"] == cases["float32 params -> bfloat16"]["copies"] == len(table)
    assert cases["bfloat16 params"]["tensors"] == len(table) and cases["bfloat16 params"]["copies"] == transposed
    assert cases["bfloat16 params, transposed in torch"]["copies"] == 0  # every tensor a view of a JAX buffer

    grpo = steps["grpo"]
    assert len(grpo["iterations"]) == 2 and grpo["first_iteration_seconds"] == grpo["iterations"][0]["step_time"]
    for it in grpo["iterations"]:
        parts = [it[k] for k in ("generate_time", "logprob_time", "update_time", "sync_time")]
        assert it["grade_time"] <= it["generate_time"] and sum(parts) <= it["step_time"] * 1.001

    # Three files, whatever the steps: the device tool brings back at most 8.
    assert sorted(os.listdir(out)) == ["bench_gpu.json", "bench_gpu.log", "bench_gpu.md"]

    # The table: printed and written, one row per step.
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.75" in text
    written = (out / "bench_gpu.md").read_text()
    assert written.strip() in text
    assert "| step | status | seconds | result |" in written
    for name in STEPS:
        assert f"| {name} | ok | " in written


def test_a_step_that_raises_or_runs_over_is_recorded_failed_and_the_next_still_runs(tmp_path):
    out = tmp_path / "out"
    flags = "--smoke --only matmul,sync --fail-step matmul --hang-step sync --budget-s 3"
    done = subprocess.run(
        [sys.executable, SCRIPT, *flags.split(), "--out", str(out)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "bench_gpu.json").read_text())
    assert report["complete"] and list(report["steps"]) == ["matmul", "sync"]
    matmul, sync = report["steps"]["matmul"], report["steps"]["sync"]
    assert matmul["status"] == "failed" and matmul["error"] == "RuntimeError: made to fail by --fail-step matmul"
    assert "RuntimeError: made to fail by --fail-step matmul" in (out / "bench_gpu.log").read_text()
    assert sync["status"] == "failed" and sync["error"] == "ran over its budget of 3 s (killed)"
    assert 3 <= sync["seconds"] < 30
    assert "| matmul | failed |" in done.stdout and "| sync | failed |" in done.stdout


def test_bad_flags_are_refused():
    for flags, named in (
        (["--only", "matmul,nosuch"], "nosuch"),
        (["--attention", "flash"], "flash"),
        (["--variants", "baseline,fastest"], "fastest"),
        (["--sampler-batches", "256,0"], "256,0"),
        (["--remat-policy", "everything"], "everything"),
    ):
        done = subprocess.run([sys.executable, SCRIPT, *flags], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert done.returncode == 2 and named in done.stderr


def test_the_attention_choices_are_the_models():
    from benchmarks import gpu as bench_gpu

    assert bench_gpu.ATTENTION_IMPLEMENTATIONS == attention.ATTENTION_IMPLEMENTATIONS


def base_params(sweep):
    """6 x params x tokens of the sweep's baseline: the least a step's FLOPs can be."""
    return sweep["variants"]["baseline"]["flops_per_step"] / 6


@pytest.mark.slow  # 112 s on a 2-core CPU: the default run keeps the smoke test of every step above
def test_the_next_gpu_runs_steps_measure_what_they_name(tmp_path):
    """The steps `--only` adds for a profile of the update, the first iteration and TRL (docs/gpu.md, "The next GPU
    run"), in `--only`'s order with the matmul rate first: the update's variants each compiled and timed, the
    first profiled; the first iteration compiled cold, then loaded from the persistent cache by a second process;
    TRL's trainer timed where trl is installed (else recorded failed, naming the import); the sampler's
    bandwidth fraction its bytes over its time over the copy bandwidth, and no transformers baseline above
    `sampler_torch_max_batch`."""
    from benchmarks import gpu as bench_gpu
    from benchmarks import limits

    out = tmp_path / "out"
    variants = "baseline,save_projections,save_dots,no_remat,scanned"
    flags = ["--smoke", "--only", "update_sweep,compile,trl,sampler", "--variants", variants]  # matmul: added
    done = subprocess.run(
        [sys.executable, SCRIPT, *flags, "--out", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True
    )
    report = json.loads((out / "bench_gpu.json").read_text())
    steps = report["steps"]
    assert list(steps) == ["matmul", "update_sweep", "compile", "trl", "sampler"], done.stdout[-3000:]

    sweep, matmul = steps["update_sweep"], steps["matmul"]
    assert sweep["status"] == "ok" and list(sweep["variants"]) == variants.split(","), sweep
    for name, v in sweep["variants"].items():
        assert math.isclose(v["mfu"], v["tflops"] / matmul["tflops"]), name
        assert ("profile" in v) == (name == "baseline")
        assert v["skipped_updates"] == 0 and math.isfinite(v["loss"])
    flops = {name: v.get("xla_flops_per_step") for name, v in sweep["variants"].items()}
    # the more remat keeps, the less it recomputes: XLA's own count of the program's FLOPs falls towards no remat's
    assert flops["baseline"] > flops["save_projections"] > flops["save_dots"] > flops["no_remat"], flops
    executed = {name: v.get("executed_flops_per_step") for name, v in sweep["variants"].items()}
    assert executed["baseline"] > executed["save_projections"] > executed["no_remat"] >= 6 * base_params(sweep)
    assert executed["scanned"] is None and "hfu" not in sweep["variants"]["scanned"]  # a scan's body counts once
    base = sweep["variants"]["baseline"]
    assert base["attention_implementation"] == "blocked"  # on a CPU: XLA counts its matmuls, nothing is added
    assert base["executed_flops_per_step"] == base["lowered_flops_per_step"]
    assert math.isclose(base["hfu"], base["executed_tflops"] / matmul["tflops"]) and base["hfu"] > base["mfu"]
    profile = base["profile"]
    assert math.isclose(sum(profile["share_by_class"].values()), 1.0) and profile["share_by_class"]["matmul"] > 0
    assert profile["busy_seconds"] <= profile["window_seconds"] and profile["ops"] > 0
    matmul_seconds = profile["seconds_by_class"]["matmul"] / profile["steps"]
    kernel_rate = base["lowered_flops_per_step"] / matmul_seconds / 1e12
    assert math.isclose(profile["matmul_kernel_fraction"], kernel_rate / matmul["tflops"])

    cases = steps["compile"]["cases"]
    assert list(cases) == ["unrolled, cold", "unrolled, warm", "scanned, cold", "scanned, warm"], cases
    for layers in ("unrolled", "scanned"):
        cold, warm = cases[f"{layers}, cold"], cases[f"{layers}, warm"]
        assert cold["scan_layers"] == warm["scan_layers"] == (layers == "scanned")
        assert cold["cache_misses"] > 0 and warm["cache_misses"] == 0 and warm["cache_hits"] >= cold["cache_misses"]
        assert warm["xla_compile_seconds"] < cold["xla_compile_seconds"]

    trl = steps["trl"]
    try:
        import trl as _  # noqa: F401

        assert trl["status"] == "ok", trl
        (generate,) = trl["variants"].values()  # no static cache on the CPU smoke run
        assert len(generate["iterations"]) == 2 and generate["peak_memory_bytes"] > 0
    except ImportError:
        assert trl["status"] == "failed" and "No module named 'trl'" in trl["error"], trl

    sampler = steps["sampler"]
    batches = sampler["batches"]
    config = tiny_config(**bench_gpu.MODELS["tiny"], param_dtype="bfloat16", dtype="bfloat16")
    p = bench_gpu.PROFILES["smoke"]
    for batch, b in batches.items():
        read = limits.decode_bytes(
            limits.weight_bytes(config, "bfloat16"),
            limits.kv_bytes_per_position(config, "bfloat16"),
            [p["sampler_prompt"]] * int(batch),
            p["sampler_new_tokens"],
        )
        seconds = int(batch) * p["sampler_new_tokens"] / b["jax_tokens_per_second"]
        assert math.isclose(b["bandwidth_fraction"], read / seconds / sampler["copy_bandwidth_bytes_per_second"])
        assert ("ratio" in b) == (int(batch) <= p["sampler_torch_max_batch"])
