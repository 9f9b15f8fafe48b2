"""JAX's persistent compilation cache for the scripts: a second run loads its programs from disk.

A training run compiles a few dozen programs (sampler prefill and decode per shape bucket, the log-prob
passes, the update); on a CPU that is most of the first iteration. With the cache on, XLA's executables are
written to a directory and a later run with the same programs loads them instead of compiling. JAX keys each
entry on the program, the backend, the device kind and the compile options, so a changed program (other
shapes, another model, other flags) simply compiles anew: the cache is never wrong, only cold.

JAX's cache still traces and lowers each program before looking it up (for the tiny model's update about 1.6 s
on a 2-core CPU); what it saves is XLA's compile.

`scripts/train.py` turns it on from `config.compilation_cache_dir` ("auto" by default) and
`scripts/evaluate.py` from `--compilation-cache-dir`; a library user calls `enable` themselves, or not.
"""

from __future__ import annotations

import os
from typing import Optional

import jax

AUTO = "auto"


def default_directory() -> str:
    """What "auto" means: JAX's own `$JAX_COMPILATION_CACHE_DIR` when set, else
    `$XDG_CACHE_HOME/mathrl_jax/jax_compilation_cache` (`~/.cache/...` without XDG_CACHE_HOME)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mathrl_jax", "jax_compilation_cache")


def enable(directory: Optional[str], option: str = "compilation_cache_dir") -> Optional[str]:
    """Turns on the persistent compilation cache in `directory` ("auto": `default_directory()`; "" or None: off).

    Every program is cached, however small or quick to compile: the tiny offline model's programs each
    compile in well under JAX's default threshold of one second, and there are many of them.
    Call it before the first compilation. Returns the directory used, or None when off.

    Raises ValueError naming `option` and the value when the directory cannot be created or written.
    """
    if not directory:
        jax.config.update("jax_enable_compilation_cache", False)  # off even when JAX_COMPILATION_CACHE_DIR is set
        return None
    path = default_directory() if directory == AUTO else os.path.abspath(os.path.expanduser(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option}={directory!r}: {path} exists and is not a directory (give a directory, or '')")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{option}={directory!r}: cannot create {path}: {error.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{option}={directory!r}: {path} is not writable (give another directory, or '' for none)")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no minimum, and no backend override
    return path
