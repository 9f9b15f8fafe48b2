"""JAX's persistent compilation cache (`mathrl_jax.compile_cache`, on by default for scripts/): a second process
running the same program loads it from the directory instead of compiling; bad directories name the option."""

import os
import subprocess
import sys

import pytest

from mathrl_jax import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import sys
import jax, jax.numpy as jnp
from mathrl_jax import compile_cache
events = []
jax.monitoring.register_event_listener(lambda event, **kw: events.append(event))
compile_cache.enable(sys.argv[1])
jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)(jnp.ones((4, 3))).block_until_ready()
count = lambda name: events.count("/jax/compilation_cache/" + name)
print("hits", count("cache_hits"), "misses", count("cache_misses"))
"""


def run_program(directory, env=None):
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, directory],
        cwd=ROOT,
        env=dict(
            {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}, PYTHONPATH=ROOT, **(env or {})
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    return int(words[words.index("hits") + 1]), int(words[words.index("misses") + 1])


def test_a_second_process_loads_the_program_instead_of_compiling_it(tmp_path):
    cache = str(tmp_path / "cache")
    hits, misses = run_program(cache)
    assert hits == 0 and misses >= 1
    entries = os.listdir(cache)
    assert entries  # written, however quick the compilation was
    hits, misses = run_program(cache)
    assert hits >= 1 and misses == 0
    assert sorted(os.listdir(cache)) == sorted(entries)  # nothing new to write


def test_auto_is_under_xdg_cache_home_and_empty_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_own"))
    assert compile_cache.default_directory() == str(tmp_path / "jax_own")  # JAX's own variable first
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_directory() == str(tmp_path / "xdg" / "mathrl_jax" / "jax_compilation_cache")
    hits, misses = run_program("auto", env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert misses >= 1 and os.listdir(compile_cache.default_directory())
    hits, misses = run_program("", env={"XDG_CACHE_HOME": str(tmp_path / "off")})
    assert hits == misses == 0 and not (tmp_path / "off").exists()
    jax_own = tmp_path / "jax_own"  # off even where JAX itself would read its variable
    hits, misses = run_program("", env={"JAX_COMPILATION_CACHE_DIR": str(jax_own)})
    assert hits == misses == 0 and not (jax_own.exists() and os.listdir(jax_own))


def test_a_directory_that_cannot_hold_the_cache_names_the_option(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    with pytest.raises(ValueError, match=r"compilation_cache_dir=.*a_file.*not a directory"):
        compile_cache.enable(str(a_file))
    with pytest.raises(ValueError, match="cannot create"):
        compile_cache.enable(str(a_file / "below"))


def run_script(name, *args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", name), *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_py_exits_2_on_a_bad_cache_directory(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    done = run_script("train.py", f"--config.compilation_cache_dir={a_file}", f"--config.run_dir={tmp_path / 'run'}")
    assert done.returncode == 2
    assert "train.py: error: compilation_cache_dir=" in done.stderr and "not a directory" in done.stderr
    assert not (tmp_path / "run").exists()


def test_evaluate_py_exits_2_on_a_bad_cache_directory(tmp_path):
    model = tmp_path / "model"  # passes evaluate.py's look at the directory, which comes before the cache
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    done = run_script("evaluate.py", "--model", str(model), "--compilation-cache-dir", str(a_file))
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("evaluate.py: error: --compilation-cache-dir=") and "not a directory" in message
    assert "Traceback" not in done.stderr and done.stdout == ""
