"""Compiled programs kept on disk and loaded without tracing (`mathrl_jax.executable_cache`): a loaded program
computes what the jitted function does; anything that defines the program (identity, shapes, static arguments)
keys it (the host CPU and JAX flags changed in-process included); a damaged, foreign or planted entry is never
deserialised but compiled again; and a second training process loads the update and the sampler's programs instead
of tracing them, with every metric equal to a run without any cache."""

import functools
import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mathrl_jax import executable_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def own_secret(tmp_path_factory, monkeypatch):
    """Each test's entries are authenticated with a secret of its own, not the user's (~/.config)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


def make_program(scale, traces):
    """A jitted function closing over `scale` (which its identity must describe), counting its traces."""

    @functools.partial(jax.jit, static_argnames=("power",), donate_argnums=(1,))
    def program(params, carry, *, power):
        traces.append(power)
        return {"out": jnp.tanh(params["w"] @ carry) ** power * scale, "sum": jnp.sum(carry)}

    return program


def arguments(rows=3):
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(rows, rows)), jnp.float32)}
    return params, jnp.asarray(rng.normal(size=(rows, 2)), jnp.float32)


def test_a_loaded_program_computes_what_the_jitted_one_does_without_tracing(tmp_path):
    traces = []
    params, carry = arguments()
    expected = jax.device_get(make_program(2.0, [])(params, jnp.copy(carry), power=3))

    first = executable_cache.CachedJit(make_program(2.0, traces), str(tmp_path), "program", {"scale": 2.0})
    got = jax.device_get(first(params, jnp.copy(carry), power=3))
    assert (first.compiled, first.loaded, len(traces)) == (1, 0, 1)
    assert len(os.listdir(tmp_path)) == 1
    second = executable_cache.CachedJit(make_program(2.0, traces), str(tmp_path), "program", {"scale": 2.0})
    again = jax.device_get(second(params, jnp.copy(carry), power=3))
    assert (second.compiled, second.loaded, len(traces)) == (0, 1, 1)  # loaded, not traced
    for result in (got, again):
        np.testing.assert_array_equal(result["out"], expected["out"])
        np.testing.assert_array_equal(result["sum"], expected["sum"])
    donated = jnp.copy(carry)
    second(params, donated, power=3)
    assert donated.is_deleted()  # the loaded program keeps the jit's donation


@pytest.mark.parametrize(
    "change",
    ["identity", "static argument", "shape", "dtype"],
)
def test_whatever_defines_the_program_keys_it(change, tmp_path):
    params, carry = arguments()
    cached = executable_cache.CachedJit(make_program(2.0, []), str(tmp_path), "program", {"scale": 2.0})
    cached(params, jnp.copy(carry), power=3)
    scale, power = 2.0, 3
    if change == "identity":
        scale = 5.0
    elif change == "static argument":
        power = 1
    elif change == "shape":
        params, carry = arguments(rows=4)
    else:
        carry = carry.astype(jnp.bfloat16)
    traces = []
    other = executable_cache.CachedJit(make_program(scale, traces), str(tmp_path), "program", {"scale": scale})
    result = jax.device_get(other(params, jnp.copy(carry), power=power))
    assert (other.compiled, other.loaded, len(traces)) == (1, 0, 1)  # not the first entry
    assert len(os.listdir(tmp_path)) == 2
    expected = jax.device_get(make_program(scale, [])(params, jnp.copy(carry), power=power))
    np.testing.assert_allclose(np.asarray(result["out"], np.float32), np.asarray(expected["out"], np.float32))


def test_canonical_text_has_no_addresses_and_sorted_keys():
    def f():
        pass

    text = executable_cache.canonical({"b": f, "a": [1, 2.5]})
    assert "0x" not in text and text.index("'a'") < text.index("'b'")
    assert text == executable_cache.canonical({"a": [1, 2.5], "b": f})


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path, caplog):
    params, carry = arguments()
    executable_cache.CachedJit(make_program(2.0, []), str(tmp_path), "program", None)(params, jnp.copy(carry), power=2)
    (entry,) = os.listdir(tmp_path)
    with open(tmp_path / entry, "r+b") as f:
        f.truncate(100)
    traces = []
    cached = executable_cache.CachedJit(make_program(2.0, traces), str(tmp_path), "program", None)
    with caplog.at_level(logging.WARNING, logger="mathrl_jax.executable_cache"):
        result = jax.device_get(cached(params, jnp.copy(carry), power=2))
    assert "cannot load the cached executable" in caplog.text and entry in caplog.text
    assert (cached.compiled, cached.loaded, len(traces)) == (1, 0, 1)
    expected = jax.device_get(make_program(2.0, [])(params, jnp.copy(carry), power=2))
    np.testing.assert_array_equal(result["out"], expected["out"])
    reloaded = executable_cache.CachedJit(make_program(2.0, []), str(tmp_path), "program", None)
    reloaded(params, jnp.copy(carry), power=2)
    assert reloaded.loaded == 1 and os.listdir(tmp_path) == [entry]  # rewritten whole, no temporary left


def test_an_unwritable_directory_is_reported_and_the_call_still_answers(tmp_path, caplog):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory")
    params, carry = arguments()
    cached = executable_cache.CachedJit(make_program(2.0, []), str(blocked / "below"), "program", None)
    with caplog.at_level(logging.WARNING, logger="mathrl_jax.executable_cache"):
        result = jax.device_get(cached(params, jnp.copy(carry), power=2))
    assert "cannot write the cached executable" in caplog.text and "a_file" in caplog.text
    expected = jax.device_get(make_program(2.0, [])(params, jnp.copy(carry), power=2))
    np.testing.assert_array_equal(result["out"], expected["out"])
    assert os.listdir(tmp_path) == ["a_file"]


def test_host_arguments_go_to_the_jitted_function(tmp_path):
    traces = []
    cached = executable_cache.CachedJit(make_program(2.0, traces), str(tmp_path), "program", None)
    params, carry = arguments()
    cached(params, np.asarray(carry), power=2)  # a numpy leaf: no signature, the jit's own path
    assert (cached.compiled, cached.loaded) == (0, 0) and len(traces) == 1 and not os.listdir(tmp_path)


def test_off_without_a_compilation_cache():
    jitted = make_program(1.0, [])
    assert executable_cache.directory() is None  # the tests never enable JAX's cache in-process
    assert executable_cache.cached(jitted, name="program", identity=None) is jitted


TRAINING = """
import json, logging, sys
from mathrl_jax import compile_cache
from mathrl_jax.configs import default
from mathrl_jax.train import loop

model_dir, run_dir, cache = sys.argv[1:4]
compile_cache.enable(cache)
events = []
class Count(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        events.append(message.split(":")[0] + (" loaded" if " loaded " in message else " compiled"))
log = logging.getLogger("mathrl_jax.executable_cache")
log.addHandler(Count()); log.setLevel(logging.INFO)
c = default.get_config()
c.model_name_or_path, c.run_dir = model_dir, run_dir
c.warmstart.steps = 0
c.arithmetic.num_train, c.arithmetic.num_eval, c.num_eval_problems = 64, 8, 8
c.n_rollout_threads, c.group_size, c.max_new_tokens, c.num_mini_batch = 8, 4, 6, 2
c.num_iterations, c.eval_interval, c.save_interval, c.progress = 2, 0, 0, False
c.reward.num_workers = 1
history = []
loop.train(c, on_metrics=lambda i, m: history.append({k: float(v) for k, v in m.items() if not k.startswith("perf/")}))
print("RESULT" + json.dumps({"events": sorted(events), "history": history}))
"""


def train_in_a_process(model_dir, run_dir, cache):
    done = subprocess.run(
        [sys.executable, "-c", TRAINING, model_dir, str(run_dir), cache],
        cwd=ROOT,
        env=dict({k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
    return json.loads(line[len("RESULT") :])


def test_a_second_training_process_loads_its_programs_and_trains_the_same(tmp_path):
    from mathrl_jax.models import write_tiny_checkpoint

    model_dir = str(tmp_path / "model")
    write_tiny_checkpoint(model_dir, seed=0, num_hidden_layers=1)
    cache = str(tmp_path / "cache")
    uncached = train_in_a_process(model_dir, tmp_path / "run0", "")
    first = train_in_a_process(model_dir, tmp_path / "run1", cache)
    second = train_in_a_process(model_dir, tmp_path / "run2", cache)
    assert uncached["events"] == []
    programs = ("decode", "prefill", "update")
    assert sorted({e.split()[0] for e in first["events"]}) == list(programs)
    assert all(e.endswith("compiled") for e in first["events"])
    assert second["events"] == sorted(e.replace("compiled", "loaded") for e in first["events"])
    assert len(uncached["history"]) == 2
    for run in (first, second):  # the same programs: every metric equal, to the bit
        assert run["history"] == uncached["history"]


# ------------------------------------------------------------------ entries that must not be loaded


def write_one_entry(directory):
    """Compiles the program once into `directory`; returns the entry's path and the arguments."""
    params, carry = arguments()
    first = executable_cache.CachedJit(make_program(2.0, []), str(directory), "program", None)
    first(params, jnp.copy(carry), power=2)
    (entry,) = os.listdir(directory)
    return directory / entry, params, carry


def load_again(directory, params, carry, caplog):
    """A fresh CachedJit (as in a new process) called once; returns it and its result."""
    traces = []
    cached = executable_cache.CachedJit(make_program(2.0, traces), str(directory), "program", None)
    with caplog.at_level(logging.WARNING, logger="mathrl_jax.executable_cache"):
        result = jax.device_get(cached(params, jnp.copy(carry), power=2))
    expected = jax.device_get(make_program(2.0, [])(params, jnp.copy(carry), power=2))
    np.testing.assert_array_equal(result["out"], expected["out"])
    return cached, traces


@pytest.fixture
def other_cpu(monkeypatch):
    """Runs what follows as on a CPU without AVX-512 (the host CPU's identity replaced, its memos cleared)."""

    def run_on(features):
        monkeypatch.setattr(executable_cache, "host_cpu", lambda: f"{{'features': '{features}', 'machine': 'x86_64'}}")
        executable_cache._backend.cache_clear()
        executable_cache._environment_text.cache_clear()

    yield run_on
    monkeypatch.undo()
    executable_cache._backend.cache_clear()
    executable_cache._environment_text.cache_clear()


def test_an_entry_compiled_on_another_cpu_is_never_loaded(tmp_path, other_cpu, caplog):
    other_cpu("avx avx2 avx512f sse4_2")  # the machine that wrote the entry
    foreign, params, carry = write_one_entry(tmp_path)
    other_cpu("avx avx2 sse4_2")  # this machine: no AVX-512, so the foreign code could die with SIGILL
    cached, traces = load_again(tmp_path, params, carry, caplog)
    assert (cached.compiled, cached.loaded, len(traces)) == (1, 0, 1)
    assert len(os.listdir(tmp_path)) == 2  # its own entry, beside the foreign one
    (own,) = [name for name in os.listdir(tmp_path) if name != foreign.name]
    # The foreign entry copied to this CPU's name does not pass either: its HMAC covers the CPU it was made for.
    os.replace(foreign, tmp_path / own)
    caplog.clear()
    cached, traces = load_again(tmp_path, params, carry, caplog)
    assert (cached.compiled, cached.loaded, len(traces)) == (1, 0, 1)
    assert "HMAC does not match" in caplog.text and own in caplog.text


def test_a_flipped_bit_in_an_entry_is_detected_named_and_replaced(tmp_path, caplog):
    entry, params, carry = write_one_entry(tmp_path)
    blob = bytearray(entry.read_bytes())
    blob[len(blob) * 3 // 4] ^= 0x10  # in the executable's code: loaded, it could crash with SIGILL or SIGSEGV
    entry.write_bytes(bytes(blob))
    cached, traces = load_again(tmp_path, params, carry, caplog)
    assert (cached.compiled, cached.loaded, len(traces)) == (1, 0, 1)
    assert "HMAC does not match" in caplog.text and entry.name in caplog.text
    assert entry.read_bytes() != bytes(blob)  # overwritten with a good entry
    reloaded, _ = load_again(tmp_path, params, carry, caplog)
    assert reloaded.loaded == 1


class Planted:
    """A pickle that, unpickled, writes a marker file (as a planted one could run anything)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("layout", ["a bare pickle", "a pickle after a forged header"])
def test_a_pickle_planted_in_the_directory_is_never_unpickled(layout, tmp_path, caplog):
    import pickle

    cache = tmp_path / "cache"
    entry, params, carry = write_one_entry(cache)
    marker = tmp_path / "planted_code_ran"
    payload = pickle.dumps(Planted(str(marker)))
    if layout == "a bare pickle":  # the layout of entries before format 3
        entry.write_bytes(payload)
    else:
        header = {"format": executable_cache.FORMAT, "payload_bytes": len(payload), "hmac_sha256": "0" * 64}
        entry.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    cached, traces = load_again(cache, params, carry, caplog)
    assert not marker.exists()
    assert (cached.compiled, cached.loaded, len(traces)) == (1, 0, 1)
    assert "cannot load the cached executable" in caplog.text and entry.name in caplog.text


def test_a_jax_flag_changed_in_process_selects_another_entry(tmp_path):
    params, carry = arguments()
    traces = []
    cached = executable_cache.CachedJit(make_program(2.0, traces), str(tmp_path), "program", None)
    cached(params, jnp.copy(carry), power=2)
    with jax.default_matmul_precision("highest"):  # changes the program's dots: another program, another entry
        cached(params, jnp.copy(carry), power=2)
    assert (cached.compiled, cached.loaded, len(traces)) == (2, 0, 2)
    assert len(os.listdir(tmp_path)) == 2
    jax.config.update("jax_default_matmul_precision", "highest")  # set globally, after the first call
    try:
        fresh = executable_cache.CachedJit(make_program(2.0, []), str(tmp_path), "program", None)
        fresh(params, jnp.copy(carry), power=2)
        assert (fresh.compiled, fresh.loaded) == (0, 1)
    finally:
        jax.config.update("jax_default_matmul_precision", None)
    cached(params, jnp.copy(carry), power=2)  # back to the first program, kept in memory
    assert (cached.compiled, cached.loaded, len(traces)) == (2, 0, 2)


def test_the_secret_is_private_and_one_open_to_others_turns_the_cache_off(tmp_path, caplog):
    params, carry = arguments()
    secret = tmp_path / "config" / "secret.key"
    cached = executable_cache.CachedJit(make_program(2.0, []), str(tmp_path / "cache"), "program", None, str(secret))
    cached(params, jnp.copy(carry), power=2)
    assert os.stat(secret).st_mode & 0o777 == 0o600 and len(os.listdir(tmp_path / "cache")) == 1
    loose = tmp_path / "loose.key"
    loose.write_text(secret.read_text())
    os.chmod(loose, 0o644)
    cached = executable_cache.CachedJit(make_program(2.0, []), str(tmp_path / "cache"), "program", None, str(loose))
    with caplog.at_level(logging.WARNING, logger="mathrl_jax.executable_cache"):
        cached(params, jnp.copy(carry), power=2)
    assert "open to other users" in caplog.text and (cached.loaded, cached.compiled) == (0, 0)
    with pytest.raises(ValueError, match="outside the cache directory"):
        executable_cache.CachedJit(make_program(2.0, []), str(tmp_path), "program", None, str(tmp_path / "k"))


def test_two_secrets_sharing_a_directory_keep_their_own_entries(tmp_path):
    """Two users (or hosts without a shared home) with one cache directory: each signs, finds and keeps its own
    entries; before (found in review), each removed the other's as foreign on every start."""
    params, carry = arguments()
    cache = str(tmp_path / "cache")
    alice, bob = (str(tmp_path / name / "secret.key") for name in ("alice", "bob"))
    for secret_file in (alice, bob):
        first = executable_cache.CachedJit(make_program(2.0, []), cache, "program", None, secret_file)
        first(params, jnp.copy(carry), power=2)
        assert first.compiled == 1
    assert len(os.listdir(cache)) == 2
    for secret_file in (alice, bob, alice):
        again = executable_cache.CachedJit(make_program(2.0, []), cache, "program", None, secret_file)
        again(params, jnp.copy(carry), power=2)
        assert (again.loaded, again.compiled) == (1, 0)
    assert len(os.listdir(cache)) == 2
