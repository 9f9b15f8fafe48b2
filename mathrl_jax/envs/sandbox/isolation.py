"""Which isolation layers this machine offers (`detect_isolation`), and checking a run's request against them.

A layer is used only where it works here: `unshare` (with or without a user namespace), a writable
pids cgroup, a writable memory cgroup, a kernel with Landlock, libseccomp, a root caller that can give the
program a uid owning nothing. `run_python(isolation="auto")` takes them all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

from mathrl_jax.envs.sandbox import privileges
from mathrl_jax.envs.sandbox.audit import READ_ROOTS
from mathrl_jax.envs.sandbox.cgroup import memory_cgroup_parent, pids_cgroup_parent
from mathrl_jax.envs.sandbox.landlock import landlock_abi
from mathrl_jax.envs.sandbox.limits import Isolation
from mathrl_jax.envs.sandbox.seccomp import seccomp_available

NAMESPACE_FLAGS = (
    "--net",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--mount-proc",
    "--ipc",
    "--uts",
    "--cgroup",
)
"""`unshare` options of a namespaced run: fresh net, pid (with its own /proc), mount, ipc, uts and cgroup
namespaces; `--kill-child` ends the namespace's processes when `unshare` dies."""

USER_NAMESPACE_FLAGS = ("--user", "--map-root-user")
"""Added where the caller cannot make namespaces by itself (not root, or no `CAP_SYS_ADMIN`): a fresh user
namespace whose root is the caller. Its root owns the caller's files, so the program cannot take a uid that
owns nothing (only one uid is mapped without `newuidmap`): read-only mounts and seccomp hold metadata there."""


def unshare_flags(unprivileged_uid: bool) -> tuple[str, ...]:
    """The `unshare` options of a namespaced run: without a user namespace where the program takes a uid that owns
    nothing (`unprivileged_uid`: the caller is root, and must hold `CAP_SYS_ADMIN`), else with one whose root is
    the caller (never the host's root without a user namespace around it)."""
    return NAMESPACE_FLAGS if unprivileged_uid else USER_NAMESPACE_FLAGS + NAMESPACE_FLAGS


@functools.cache
def _namespaces_work(unshare: str, unprivileged_uid: bool) -> bool:
    """Whether the `unshare` binary makes the sandbox's namespaces here (containers often forbid it) and a run can
    build its private root in them."""
    path = shutil.which(unshare)
    if path is None or not _exits_zero([path, *unshare_flags(unprivileged_uid), "--", "/bin/sh", "-c", "exit 0"], 10):
        return False
    return _private_root_works(path, unprivileged_uid)


def _exits_zero(command: list[str], timeout_s: float) -> bool:
    """Whether a probe `command` (no input or output, a minimal PATH) exits 0 within `timeout_s`."""
    try:
        probe = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _private_root_works(unshare: str, unprivileged_uid: bool) -> bool:
    """Whether a namespaced run can build its own root file system here (bind mounts and `pivot_root`,
    `private_root.enter_private_root`). A namespaced run fails closed without it (host sockets would be reachable), so
    a machine where `unshare` works but this does not is given the modes without namespaces instead."""
    from mathrl_jax.envs.sandbox import child

    base = os.path.realpath(tempfile.mkdtemp(prefix="mathrl_sandbox_probe_"))
    try:
        os.mkdir(os.path.join(base, "work"), 0o700)
        flags = unshare_flags(unprivileged_uid)
        command = [unshare, *flags, "--", sys.executable, "-I", "-B", "-S", child.__file__]
        return _exits_zero(command + ["--probe-root", base, json.dumps(readable_roots())], timeout_s=30)
    except OSError:  # the probe's directory could not be made
        return False
    finally:
        shutil.rmtree(base, ignore_errors=True)


def readable_roots() -> list[str]:
    """What a run may read: this interpreter's prefixes (and their real paths) and the system's `READ_ROOTS`."""
    roots = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for candidate in (path, os.path.realpath(path)):
            if candidate and candidate not in roots:
                roots.append(candidate)
    return [r for r in (*roots, *READ_ROOTS) if os.path.exists(r)]


def unprivileged_uid_possible(namespaces: bool, unshare: str = "unshare") -> bool:
    """Whether a run (with or without `namespaces`) can give the program a uid that owns nothing on the host:
    a root caller able to drop to it and still read the readable roots (`privileges.can_drop_privileges`),
    and, with namespaces, able to make them without a user namespace."""
    if not sys.platform.startswith("linux") or not privileges.can_drop_privileges(readable_roots()):
        return False
    return not namespaces or _namespaces_work(unshare, unprivileged_uid=True)


def detect_isolation(unshare: str = "unshare") -> Isolation:
    """The strongest isolation this machine offers (`unshare` is the binary to probe)."""
    linux = sys.platform.startswith("linux")
    uid_in_namespaces = linux and unprivileged_uid_possible(namespaces=True, unshare=unshare)
    namespaces = uid_in_namespaces or (linux and _namespaces_work(unshare, unprivileged_uid=False))
    return Isolation(
        namespaces=namespaces,
        pids_cgroup=pids_cgroup_parent() is not None,
        landlock_abi=landlock_abi(),
        memory_cgroup=memory_cgroup_parent() is not None,
        seccomp=linux and seccomp_available(),
        unprivileged_uid=uid_in_namespaces if namespaces else unprivileged_uid_possible(namespaces=False),
    )


NOT_A_SANDBOX = (
    "it is not a sandbox: the kernel would not hold the program once it switches the audit hook off (from Python, "
    "with ctypes): it could read and write host files, reach host sockets and run programs. Run on a machine with "
    "user namespaces, or Landlock (Linux >= 5.13) and libseccomp; or pass allow_not_a_sandbox=True to accept that"
)


def check_contains(isolation: Isolation, allow_not_a_sandbox: bool) -> None:
    """Raises (RuntimeError, naming the missing layers) if `isolation` cannot contain model code and the caller did
    not accept that with `allow_not_a_sandbox=True` (see `Isolation.contains`)."""
    if isolation.contains or allow_not_a_sandbox:
        return
    missing = ["namespaces"]
    if not isolation.landlock_abi:
        missing.append("Landlock")
    if not isolation.seccomp:
        missing.append("seccomp")
    raise RuntimeError(
        f"refusing to run model code under isolation {isolation.name!r} (no {', no '.join(missing)}): {NOT_A_SANDBOX}"
    )


def resolve_isolation(isolation: str | Isolation) -> Isolation:
    """The layers of `run_python(isolation=...)`; raises if a requested layer is missing or the name is unknown."""
    available = detect_isolation()
    if isinstance(isolation, Isolation):
        requested = isolation
    elif isolation == "auto":
        return available
    elif isolation == "namespace":
        if not available.namespaces:
            raise RuntimeError("isolation='namespace' requested but `unshare` with user namespaces does not work here")
        return available
    elif isolation == "audit":
        requested = dataclasses.replace(
            available, namespaces=False, unprivileged_uid=unprivileged_uid_possible(namespaces=False)
        )
    else:
        raise ValueError(f"isolation must be 'auto', 'namespace', 'audit' or an Isolation, got {isolation!r}")
    missing = []
    if requested.namespaces and not available.namespaces:
        missing.append("namespaces")
    elif requested.namespaces and not requested.unprivileged_uid and not _namespaces_work("unshare", False):
        missing.append("namespaces with a user namespace (unshare --user)")
    if requested.pids_cgroup and not available.pids_cgroup:
        missing.append("pids_cgroup")
    if requested.memory_cgroup and not available.memory_cgroup:
        missing.append("memory_cgroup")
    if requested.seccomp and not available.seccomp:
        missing.append("seccomp (libseccomp.so.2)")
    if requested.unprivileged_uid and not unprivileged_uid_possible(requested.namespaces):
        missing.append("unprivileged_uid (a root caller with CAP_SETUID, and CAP_SYS_ADMIN for namespaces)")
    if requested.landlock_abi > available.landlock_abi:
        missing.append(f"landlock_abi={requested.landlock_abi} (kernel has {available.landlock_abi})")
    if missing:
        raise RuntimeError(f"requested isolation {requested} but this machine lacks: {', '.join(missing)}")
    return requested


def require_isolation(isolation: str | Isolation, allow_not_a_sandbox: bool = False) -> Isolation:
    """The layers `run_python(isolation=..., allow_not_a_sandbox=...)` would use; raises (RuntimeError) where a
    requested layer is missing here or the layers cannot contain model code and that was not accepted. For a
    caller that must know before its first run (the Python tool, at construction)."""
    resolved = resolve_isolation(isolation)
    check_contains(resolved, allow_not_a_sandbox)
    return resolved
