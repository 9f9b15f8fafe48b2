"""Compiled programs kept on disk and loaded without tracing: a second run skips tracing and lowering too.

JAX's persistent compilation cache (`compile_cache`) saves XLA's compile, but it is keyed on the lowered program,
so every run still traces the Python function and lowers it to StableHLO before it can look the program up. For
the update of the tiny offline model that is 1.2 s of tracing and 0.4 s of lowering against 0.5 s of loading.
This cache keys a program on what *defines* it instead, without tracing:

- `identity`: the caller's description of everything the function closes over (its configs, the model's graph
  definition, the optimizer's settings), canonicalised as text;
- the argument signature: the pytree structure and each leaf's shape, dtype, weak type and sharding;
- the environment: a hash of the mathrl_jax source files, the versions of jax, jaxlib, flax, optax, chex and
  numpy, the backend and its devices, `XLA_FLAGS` and the JAX config flags.

A hit loads the executable with `jax.experimental.serialize_executable` (MaxText's AOT `compiled_trainstep_file`
works the same way); a miss compiles through the jitted function (and so through JAX's own cache) and writes the
executable for next time. A change to the code or a closed-over setting that the identity does not describe would
not be seen, which is why the identity is built next to the code that builds the function (`train.build`), from
the same settings. An unreadable entry is reported and compiled anew; entries are written atomically.

On wherever JAX's persistent cache has a directory (`compile_cache.enable`, or `$JAX_COMPILATION_CACHE_DIR`), in a
subdirectory of it, for a single process: a multi-process run keeps JAX's cache only. An entry is written from a
program XLA compiled in this process (see `_compiled_without_jax_cache`), so the first run after a change to the
package compiles these programs in full once, even where JAX's cache holds them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import pickle
import re
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Optional

import jax
import numpy as np

logger = logging.getLogger(__name__)

SUBDIRECTORY = "mathrl_executables"
FORMAT = 2  # bump when the entry layout changes
# JAX config flags that do not change a program: where things are cached, logged or dumped.
_NOT_SEMANTIC = re.compile(r"cache|log|dump|timeout|pprint|traceback|explain|transfer_guard")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def canonical(value: Any) -> str:
    """`repr(value)` without memory addresses (`<function f at 0x...>` -> `<function f>`), so it is the same text
    in every process. Dicts are written with sorted keys."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {canonical(value[k])}" for k in sorted(value, key=repr)) + "}"
    return _ADDRESS.sub("", repr(value))


@functools.lru_cache(maxsize=1)
def environment() -> str:
    """What every program depends on besides its identity and arguments (computed once per process)."""
    package = os.path.dirname(os.path.abspath(__file__))
    source = hashlib.sha256()
    for folder, dirs, files in os.walk(package):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                source.update(os.path.relpath(path, package).encode())
                with open(path, "rb") as f:
                    source.update(f.read())
    versions = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "flax", "optax", "chex", "numpy")}
    device = jax.devices()[0]
    flags = {k: v for k, v in jax.config.values.items() if not _NOT_SEMANTIC.search(k)}
    return canonical(
        dict(
            format=FORMAT,
            source=source.hexdigest(),
            versions=versions,
            platform=(device.platform, device.client.platform_version),
            devices=[(d.id, d.device_kind, d.process_index) for d in jax.devices()],
            xla_flags=os.environ.get("XLA_FLAGS", ""),
            jax_flags=flags,
        )
    )


def _signature(args) -> Optional[tuple]:
    """The arguments' pytree structure and each leaf's (shape, dtype, weak type, sharding); None when a leaf is not
    a jax.Array (those calls go to the jitted function as they are)."""
    leaves, treedef = jax.tree.flatten(args)
    if not all(isinstance(x, jax.Array) for x in leaves):
        return None
    avals = [jax.typeof(x) for x in leaves]
    return (treedef, tuple((a.shape, str(a.dtype), a.weak_type, x.sharding) for a, x in zip(avals, leaves)))


def _mesh_context() -> tuple:
    """The mesh set by `jax.set_mesh` around the call: sharding constraints inside the program depend on it."""
    mesh = jax.sharding.get_mesh()
    devices = () if mesh.empty else tuple(int(i) for i in np.asarray(mesh.device_ids).ravel())
    return (("mesh", repr(jax.sharding.get_abstract_mesh()), repr(mesh), devices),)


class CachedJit:
    """A jitted function whose executables, one per argument signature, come from `directory` when there."""

    def __init__(self, jitted: Callable, directory: str, name: str, identity: Any):
        if not hasattr(jitted, "trace"):
            raise TypeError(f"{name}: expected a jax.jit-wrapped function, got {type(jitted).__name__}")
        self.jitted = jitted
        self.directory = directory
        self.name = name
        self.identity = canonical(identity)
        self._executables: Dict[tuple, Callable] = {}
        self.loaded = self.compiled = 0  # counts, for tests and logs

    def path(self, signature) -> str:
        treedef, leaves, static = signature
        text = "\n".join((self.name, self.identity, environment(), str(treedef), canonical(leaves), canonical(static)))
        return os.path.join(self.directory, f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:40]}.bin")

    def __call__(self, *args, **static):
        """`jitted(*args, **static)`: positional arguments are traced, keyword ones are the jit's static ones."""
        signature = _signature(args)
        if signature is None:
            return self.jitted(*args, **static)
        signature += (tuple(sorted(static.items())) + _mesh_context(),)
        executable = self._executables.get(signature)
        if executable is None:
            executable = self._executables[signature] = self._load_or_compile(signature, args, static)
        return executable(*args)

    def _load_or_compile(self, signature, args, static) -> Callable:
        from jax.experimental import serialize_executable

        start = time.perf_counter()
        path = self.path(signature)
        if os.path.exists(path):
            try:
                with open(path, "rb") as f:
                    serialized, in_tree, out_tree, device_ids = pickle.load(f)
                devices = {d.id: d for d in jax.devices()}
                executable = serialize_executable.deserialize_and_load(
                    serialized, in_tree, out_tree, execution_devices=[devices[i] for i in device_ids]
                )
                self.loaded += 1
                logger.info("%s: loaded %s in %.2f s", self.name, path, time.perf_counter() - start)
                return executable
            except Exception as error:  # noqa: BLE001  a truncated or foreign file: compile, and overwrite it
                logger.warning(
                    "%s: cannot load the cached executable %s (%s); compiling it again", self.name, path, error
                )
        lowered = self.jitted.trace(*args, **static).lower()
        fresh = _compiled_without_jax_cache(lowered)
        executable = lowered.compile() if fresh is None else fresh
        self.compiled += 1
        logger.info("%s: traced and compiled in %.2f s", self.name, time.perf_counter() - start)
        if fresh is None:
            return executable
        try:
            device_ids = [d.id for d in executable.runtime_executable().local_devices()]  # in the program's order
            blob = pickle.dumps((*serialize_executable.serialize(executable), device_ids))
            os.makedirs(self.directory, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".writing-")
            try:
                with os.fdopen(handle, "wb") as f:
                    f.write(blob)
                os.replace(temporary, path)  # atomic: a reader sees the whole entry or none
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
        except Exception as error:  # noqa: BLE001  the run goes on without the entry
            logger.warning("%s: cannot write the cached executable to %s (%s)", self.name, self.directory, error)
        return executable


_FRESH = threading.Lock()


def _compiled_without_jax_cache(lowered):
    """`lowered.compile()` by XLA itself, not loaded from JAX's persistent cache; None if that cannot be arranged.

    Why: on XLA:CPU an executable loaded from JAX's cache serializes incompletely (its fusions' code is missing:
    running the reloaded copy fails with "Function ... not found"), so only a freshly compiled one may be written.
    JAX has no public switch for one compilation, so its private once-per-process flag is turned off around this
    one; other threads compiling meanwhile just miss JAX's cache. A JAX without that flag gets None (the entry is
    then not written, and the run goes on uncached)."""
    from jax._src import compilation_cache as jax_cache

    if not (hasattr(jax_cache, "_cache_checked") and hasattr(jax_cache, "_cache_used")):
        logger.warning("executable cache: JAX %s cannot compile around its own cache; not written", jax.__version__)
        return None
    with _FRESH:
        saved = jax_cache._cache_checked, jax_cache._cache_used
        jax_cache._cache_checked, jax_cache._cache_used = True, False
        try:
            return lowered.compile()
        finally:
            jax_cache._cache_checked, jax_cache._cache_used = saved


def directory() -> Optional[str]:
    """Where executables are kept: a subdirectory of the enabled JAX compilation cache, or None when that is off
    or the run has several processes."""
    where = jax.config.values.get("jax_compilation_cache_dir")
    if not jax.config.values.get("jax_enable_compilation_cache") or not where:
        return None
    if jax.process_count() > 1:
        return None
    return os.path.join(where, SUBDIRECTORY)


def cached(jitted: Callable, *, name: str, identity: Any) -> Callable:
    """`jitted` with its executables kept in `directory()`, or `jitted` itself when there is none.

    `identity` must describe everything `jitted` closes over that changes its program (see the module docstring).
    """
    where = directory()
    return jitted if where is None else CachedJit(jitted, where, name, identity)
