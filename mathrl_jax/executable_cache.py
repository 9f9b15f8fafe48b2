"""Compiled programs kept on disk and loaded without tracing: a second run skips tracing and lowering too.

JAX's persistent compilation cache (`compile_cache`) saves XLA's compile, but it is keyed on the lowered program,
so every run still traces the Python function and lowers it to StableHLO before it can look the program up. For
the update of the tiny offline model that is 1.2 s of tracing and 0.4 s of lowering against 0.5 s of loading.
This cache keys a program on what *defines* it instead, without tracing:

- `identity`: the caller's description of everything the function closes over (its configs, the model's graph
  definition, the optimizer's settings), canonicalised as text;
- the argument signature: the pytree structure and each leaf's shape, dtype, weak type and sharding;
- the environment: a hash of the mathrl_jax source files, the versions of jax, jaxlib, flax, optax, chex and
  numpy, the backend and its devices, the host CPU (its architecture and feature flags: XLA:CPU compiles for the
  features of the CPU it runs on, so an executable from another CPU may hold instructions this one lacks, and die
  with SIGILL), all fixed per process; and, read at every lookup, `XLA_FLAGS` and the JAX config flags (one changed
  in-process, e.g. `jax_default_matmul_precision`, selects another entry).

A hit loads the executable with `jax.experimental.serialize_executable` (MaxText's AOT `compiled_trainstep_file`
works the same way); a miss compiles through the jitted function (and so through JAX's own cache) and writes the
executable for next time. A change to the code or a closed-over setting that the identity does not describe would
not be seen, which is why the identity is built next to the code that builds the function (`train.build`), from
the same settings.

An entry is one line of JSON (the format, the payload's length, and its HMAC-SHA256) followed by the payload. The
HMAC is keyed by a random secret kept outside the cache directory (`secret_path`, created 0600 on first use) and
covers the entry's key text and its payload; the payload is unpickled only once its HMAC checks. So a damaged entry
(a flipped bit in its code would crash the process with SIGILL or SIGSEGV, printing nothing), an entry from another
machine or user, an entry renamed to another key, or a file planted in the directory (a pickle would run code) is
never deserialised: it is reported by name, removed, compiled anew and rewritten. Entries are written atomically.
The cache directory still deserves the trust of any directory of code this process runs: whoever can read the
secret can write entries it will load.

On wherever JAX's persistent cache has a directory (`compile_cache.enable`, or `$JAX_COMPILATION_CACHE_DIR`), in a
subdirectory of it, for a single process: a multi-process run keeps JAX's cache only. An entry is written from a
program XLA compiled in this process (see `_compiled_without_jax_cache`), so the first run after a change to the
package compiles these programs in full once, even where JAX's cache holds them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.metadata
import json
import logging
import os
import pickle
import platform
import re
import secrets
import stat
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Optional

import jax
import numpy as np

logger = logging.getLogger(__name__)

SUBDIRECTORY = "mathrl_executables"
FORMAT = 3  # bump when the entry layout changes (3: JSON header with an HMAC, then the payload)
SECRET_FILE = "executable_cache.key"
_HEADER_LIMIT = 4096  # bytes: the JSON line before the payload is far shorter
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
def _installation() -> str:
    """What programs depend on that cannot change within a process: the package's source and the libraries' versions
    (read once per process)."""
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
    return canonical(dict(format=FORMAT, source=source.hexdigest(), versions=versions))


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """The host CPU as the code XLA:CPU generates depends on it: the architecture and the sorted feature flags.

    XLA:CPU (through LLVM) compiles for the features of the host CPU, so an executable compiled on a CPU with, say,
    AVX-512 holds instructions that another CPU lacks. JAX's own persistent cache hashes the devices' topology
    (`jax/_src/cache_key.py`: `xla_client.get_topology_for_devices(...).fingerprint()`), a private API; the public
    record of the features is the kernel's (CPUID) in /proc/cpuinfo ("flags" on x86, "Features" on Arm); elsewhere
    `platform.processor()` is what there is.
    """
    features = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("flags", "features"):
                    features = " ".join(sorted(set(value.split())))
                    break
    except OSError:
        pass
    return canonical(dict(machine=platform.machine(), features=features or platform.processor()))


@functools.lru_cache(maxsize=1)
def _backend() -> str:
    """The backend, its devices and the host CPU: fixed once JAX has started its backend."""
    device = jax.devices()[0]
    return canonical(
        dict(
            platform=(device.platform, device.client.platform_version),
            devices=[(d.id, d.device_kind, d.process_index) for d in jax.devices()],
            host_cpu=host_cpu(),
        )
    )


@functools.lru_cache(maxsize=64)
def _semantic_flag_names(names: tuple) -> tuple:
    """The JAX config flags, of `names`, that can change a program (not where things are cached, logged, dumped)."""
    return tuple(k for k in names if not _NOT_SEMANTIC.search(k))


@functools.lru_cache(maxsize=256)
def _environment_text(flags: tuple, xla_flags: str) -> str:
    return canonical(dict(installation=_installation(), backend=_backend(), xla_flags=xla_flags, jax_flags=dict(flags)))


def environment() -> str:
    """What every program depends on besides its identity and arguments. The JAX config flags (set with
    `jax.config.update` or a context manager such as `jax.default_matmul_precision`) and `XLA_FLAGS` are read at
    every call, since they can change within a process; the rest is fixed per process."""
    values = jax.config.values  # the values in force in this thread, context managers included
    flags = tuple((k, values[k]) for k in _semantic_flag_names(tuple(values)))
    try:
        return _environment_text(flags, os.environ.get("XLA_FLAGS", ""))
    except TypeError:  # a flag value that cannot be hashed: not memoised
        return _environment_text.__wrapped__(flags, os.environ.get("XLA_FLAGS", ""))


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


def secret_path() -> str:
    """Where the secret that authenticates entries is kept: `$XDG_CONFIG_HOME/mathrl_jax/executable_cache.key`
    (`~/.config/...` without the variable), outside any cache directory, so that a file written into the cache
    directory cannot carry a valid HMAC."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(config_home, "mathrl_jax", SECRET_FILE)


_SECRETS: Dict[str, bytes] = {}
_SECRETS_LOCK = threading.Lock()


def _read_secret(path: str) -> bytes:
    """The secret in `path`, refused unless it is a regular file of this user that nobody else can read or write."""
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(handle, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise OSError(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise OSError(f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}; expected 600)")
        secret = f.read().strip()
    if len(secret) < 32:
        raise OSError(f"{path} holds {len(secret)} bytes; expected a 64-character hex secret")
    return secret


def secret(path: str) -> bytes:
    """The secret in `path`, created (0600, 32 random bytes in hex) if missing; read once per process."""
    with _SECRETS_LOCK:
        if path not in _SECRETS:
            try:
                _SECRETS[path] = _read_secret(path)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".writing-")  # mode 0600
                try:
                    with os.fdopen(handle, "w") as f:
                        f.write(secrets.token_hex(32) + "\n")
                    try:
                        os.link(temporary, path)  # fails if another process made it meanwhile: theirs is used
                    except FileExistsError:
                        pass
                finally:
                    os.remove(temporary)
                _SECRETS[path] = _read_secret(path)
        return _SECRETS[path]


class _BadEntry(Exception):
    """An entry that must not be deserialised: damaged, foreign, or not an entry at all."""


class CachedJit:
    """A jitted function whose executables, one per argument signature, come from `directory` when there.

    `secret_file` (default `secret_path()`) holds the key of the entries' HMAC; it must lie outside `directory`.
    """

    def __init__(self, jitted: Callable, directory: str, name: str, identity: Any, secret_file: Optional[str] = None):
        if not hasattr(jitted, "trace"):
            raise TypeError(f"{name}: expected a jax.jit-wrapped function, got {type(jitted).__name__}")
        self.jitted = jitted
        self.directory = directory
        self.name = name
        self.identity = canonical(identity)
        self.secret_file = secret_path() if secret_file is None else secret_file
        inside = os.path.realpath(self.secret_file).startswith(os.path.join(os.path.realpath(directory), ""))
        if inside:
            raise ValueError(f"{name}: the secret {self.secret_file} must lie outside the cache directory {directory}")
        self._executables: Dict[tuple, Callable] = {}
        self.loaded = self.compiled = 0  # counts, for tests and logs

    def key(self, signature, environment_text: str) -> str:
        """The text an entry is keyed by: name, identity, environment and argument signature."""
        treedef, leaves, static = signature
        return "\n".join(
            (self.name, self.identity, environment_text, str(treedef), canonical(leaves), canonical(static))
        )

    def path(self, signature, environment_text: Optional[str] = None) -> str:
        """The entry's file: named by the key and by whose secret signs it, so that users (or hosts) sharing one
        cache directory with secrets of their own never read, and never remove, each other's entries."""
        text = self.key(signature, environment() if environment_text is None else environment_text)
        owner = hashlib.sha256(b"mathrl_jax cache owner\n" + secret(self.secret_file)).hexdigest()[:12]
        return os.path.join(self.directory, f"{self.name}-{owner}-{hashlib.sha256(text.encode()).hexdigest()[:40]}.bin")

    def __call__(self, *args, **static):
        """`jitted(*args, **static)`: positional arguments are traced, keyword ones are the jit's static ones."""
        signature = _signature(args)
        if signature is None:
            return self.jitted(*args, **static)
        signature += (tuple(sorted(static.items())) + _mesh_context(),)
        environment_text = environment()  # read now: a flag changed since the last call selects another program
        executable = self._executables.get((signature, environment_text))
        if executable is None:
            executable = self._load_or_compile(signature, environment_text, args, static)
            self._executables[(signature, environment_text)] = executable
        return executable(*args)

    def _mac(self, key_text: str, payload: bytes) -> str:
        """HMAC-SHA256 of the entry's key text and payload: an entry only counts under the key it was written for."""
        digest = hmac.new(secret(self.secret_file), digestmod=hashlib.sha256)
        digest.update(hashlib.sha256(key_text.encode()).digest())
        digest.update(payload)
        return digest.hexdigest()

    def _read_entry(self, path: str, key_text: str) -> tuple:
        """The entry's (serialized, in_tree, out_tree, device_ids), unpickled only once its HMAC checks."""
        with open(path, "rb") as f:
            blob = f.read()
        line_end = blob.find(b"\n", 0, _HEADER_LIMIT)
        try:
            header = json.loads(blob[:line_end]) if line_end > 0 else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise _BadEntry("not an entry of this format")
        payload = blob[line_end + 1 :]
        if header.get("payload_bytes") != len(payload):
            raise _BadEntry(f"its payload has {len(payload)} bytes, its header says {header.get('payload_bytes')}")
        if not hmac.compare_digest(str(header.get("hmac_sha256")), self._mac(key_text, payload)):
            raise _BadEntry("its HMAC does not match (damaged, or not written by this cache)")
        return pickle.loads(payload)  # authenticated: written by this cache, with this secret, for this key

    def _load_or_compile(self, signature, environment_text, args, static) -> Callable:
        from jax.experimental import serialize_executable

        start = time.perf_counter()
        key_text = self.key(signature, environment_text)
        try:
            secret(self.secret_file)
        except OSError as error:  # no trusted secret: nothing is loaded or written
            logger.warning("%s: cache off: cannot use the secret %s (%s)", self.name, self.secret_file, error)
            return functools.partial(self.jitted, **static)
        path = self.path(signature, environment_text)
        if os.path.exists(path):
            try:
                serialized, in_tree, out_tree, device_ids = self._read_entry(path, key_text)
                devices = {d.id: d for d in jax.devices()}
                executable = serialize_executable.deserialize_and_load(
                    serialized, in_tree, out_tree, execution_devices=[devices[i] for i in device_ids]
                )
                self.loaded += 1
                logger.info("%s: loaded %s in %.2f s", self.name, path, time.perf_counter() - start)
                return executable
            except Exception as error:  # noqa: BLE001  damaged, truncated, foreign or planted: compile, replace it
                logger.warning(
                    "%s: cannot load the cached executable %s (%s); removed, compiling it again", self.name, path, error
                )
                try:
                    os.remove(path)
                except OSError:
                    pass
        lowered = self.jitted.trace(*args, **static).lower()
        fresh = _compiled_without_jax_cache(lowered)
        executable = lowered.compile() if fresh is None else fresh
        self.compiled += 1
        logger.info("%s: traced and compiled in %.2f s", self.name, time.perf_counter() - start)
        if fresh is None:
            return executable
        try:
            device_ids = [d.id for d in executable.runtime_executable().local_devices()]  # in the program's order
            payload = pickle.dumps((*serialize_executable.serialize(executable), device_ids))
            header = dict(format=FORMAT, payload_bytes=len(payload), hmac_sha256=self._mac(key_text, payload))
            os.makedirs(self.directory, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".writing-")
            try:
                with os.fdopen(handle, "wb") as f:
                    f.write(json.dumps(header).encode() + b"\n" + payload)
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
    if where is None:
        return jitted
    try:
        return CachedJit(jitted, where, name, identity)
    except ValueError as error:  # a secret inside the cache directory would authenticate nothing
        logger.warning("%s: executable cache off: %s", name, error)
        return jitted
