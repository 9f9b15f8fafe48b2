"""Host file metadata and privileges: no sandboxed program changes a host file's mode, owner, times, extended
attributes (file capabilities among them) or inode flags, nor makes new namespaces (issue 60).

The review's program switched the audit hook off and, in every mode, `chmod 4777`'d files under the
interpreter's prefix, `/etc`, sysfs and cgroupfs; without namespaces it also `chown`'d and `chattr +i`'d host
paths; and it gave a host copy of Python the `cap_setuid` file capability, which the host's `nobody` then ran
to become root. Three layers hold these now, each tested here on its own:

- the unprivileged uid (`Isolation.unprivileged_uid`): the program owns no host file and has no capability
  but, at most, `CAP_DAC_READ_SEARCH`; `no_new_privs` is always set;
- read-only, `nosuid` bind mounts (`Isolation.read_only_roots`, with namespaces): EROFS for any change;
- seccomp (`Isolation.seccomp`): the metadata calls, the flag ioctls and calls newer than libseccomp refused.

The victims are files this test makes inside readable roots (the interpreter's prefix, a cgroup directory)
and `/dev/null`, never a file of the machine's own.
"""

import dataclasses
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import uuid

import pytest

from mathrl_jax.data.sources import Problem
from mathrl_jax.envs import MathEnv, PythonToolEnv
from mathrl_jax.envs.sandbox import SandboxLimits, cleanup, detect_isolation, pids_cgroup_parent, privileges
from tests.envs.sandbox_modes import AVAILABLE, CONTAINED_MODES, NO_NAMESPACES, run_python
from tests.envs.test_sandbox_escapes import HOOK_OFF

LIMITS = SandboxLimits(wall_time_s=15.0, cpu_time_s=10, max_output_bytes=1 << 16)
_FS_IOC_GETFLAGS = 0x80086601

ATTACKS = r"""
import errno, fcntl, os, struct

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
AT_FDCWD = ctypes.c_long(-100)
# VFS_CAP_REVISION_2 | effective, permitted = CAP_SETUID: what `setcap cap_setuid+ep` writes.
CAPABILITY = bytes.fromhex("0100000280000000000000000000000000000000")
F, W, D, C, MOUNT = {file!r}, {writable!r}, {directory!r}, {cgroup_file!r}, {mount_point!r}

def raw(number, *args):
    if libc.syscall(number, *args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))

class XattrArgs(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("size", ctypes.c_uint32), ("flags", ctypes.c_uint32)]

class FileAttr(ctypes.Structure):
    _fields_ = [("xflags", ctypes.c_uint64), ("rest", ctypes.c_uint32 * 4)]

value = ctypes.create_string_buffer(CAPABILITY, len(CAPABILITY))
xattr_args = XattrArgs(ctypes.addressof(value), len(CAPABILITY), 0)
immutable = FileAttr(0x8)  # FS_XFLAG_IMMUTABLE

def with_fd(action):
    fd = os.open(F, os.O_RDONLY)
    try:
        action(fd)
    finally:
        os.close(fd)

def remount_then_chmod():
    # MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_RELATIME: read-write again, keeping the locked flags
    if libc.mount(None, MOUNT.encode(), None, 32 | 4096 | 2 | 4 | (1 << 21), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    os.chmod(F, 0o4777)

def mount_setattr_then_chmod():
    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    attr = MountAttr(0, 0x1, 0, 0)  # clear MOUNT_ATTR_RDONLY
    raw(442, AT_FDCWD, MOUNT.encode(), ctypes.c_uint(0x8000), ctypes.byref(attr), ctypes.c_size_t(32))
    os.chmod(F, 0o4777)

def new_user_namespace_by_clone():
    pid = libc.syscall(56, ctypes.c_ulong(0x10000000 | 17), 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    os.waitpid(pid, 0)

def new_user_namespace():
    if libc.unshare(0x10000000) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))

attempts = dict(
    chmod_setuid=lambda: os.chmod(F, 0o4777),
    chmod_directory=lambda: os.chmod(D, 0o777),
    fchmod=lambda: with_fd(lambda fd: os.fchmod(fd, 0o4777)),
    fchmodat2=lambda: raw(452, AT_FDCWD, F.encode(), 0o4777, 0),
    chown=lambda: os.chown(F, 1, 1),
    lchown_directory=lambda: os.lchown(D, 1, 1),
    utime=lambda: os.utime(F, (0, 0)),
    setxattr_user=lambda: os.setxattr(F, "user.mathrl", b"x"),
    removexattr=lambda: os.removexattr(F, "user.keep"),
    file_capability=lambda: os.setxattr(F, "security.capability", CAPABILITY),
    setxattrat=lambda: raw(463, AT_FDCWD, F.encode(), 0, b"security.capability", ctypes.byref(xattr_args), 16),
    chattr_immutable=lambda: with_fd(lambda fd: fcntl.ioctl(fd, 0x40086602, struct.pack("i", 0x10))),
    chattr_high_bits=lambda: with_fd(
        lambda fd: raw(16, fd, ctypes.c_ulong(0xFFFFFFFF00000000 | 0x40086602), ctypes.byref(ctypes.c_int(0x10)))
    ),
    file_setattr=lambda: raw(469, AT_FDCWD, F.encode(), ctypes.byref(immutable), 24, 0),
    remount_then_chmod=remount_then_chmod,
    mount_setattr_then_chmod=mount_setattr_then_chmod,
    world_writable_times=lambda: os.utime(W, None),
    user_namespace=new_user_namespace,
    user_namespace_by_clone=new_user_namespace_by_clone,
)
if C:
    attempts["cgroup_chmod"] = lambda: os.chmod(C, 0o777)
if {touch_dev_null}:
    attempts["dev_null_times"] = lambda: os.utime("/dev/null", None)
print("uid", os.getuid(), flush=True)
for what, action in attempts.items():
    attempt(what, action)
"""
"""Each attempt prints `<what> GAINED` or `<what> refused <error>`; `F` is a root-owned 0644 file, `W` a
world-writable one, `D` their directory, `C` a file of a cgroup directory, `MOUNT` the readable root they lie in."""

METADATA = {
    "chmod_setuid", "chmod_directory", "fchmod", "fchmodat2", "chown", "lchown_directory", "utime",
    "setxattr_user", "removexattr", "file_capability", "setxattrat", "chattr_immutable", "chattr_high_bits",
    "file_setattr", "remount_then_chmod", "mount_setattr_then_chmod", "world_writable_times", "cgroup_chmod",
    "dev_null_times",
}  # fmt: skip
NAMESPACES = {"user_namespace", "user_namespace_by_clone"}


def _inode_flags(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def _snapshot(path, xattrs=True):
    """Everything a metadata attack could change: mode, owner, times (ctime moves with any change), extended
    attributes and inode flags."""
    st = os.lstat(path)
    record = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns)
    if xattrs:
        attributes = {name: os.getxattr(path, name) for name in os.listxattr(path)}
        record += (sorted(attributes.items()), _inode_flags(path))
    return record


@pytest.fixture
def victims():
    """A directory under the interpreter's prefix (a readable root, bind-mounted into namespaced runs) with a
    root-owned 0644 file holding a user xattr and a world-writable file; a file of a fresh cgroup directory
    where a pids cgroup parent exists. Yields (placeholders, paths to snapshot)."""
    if os.geteuid() != 0:
        pytest.skip("the victims are root's files, as the host's are")
    directory = os.path.join(sys.prefix, f"mathrl_metadata_victim_{uuid.uuid4().hex[:12]}")
    os.mkdir(directory, 0o755)
    file, writable = os.path.join(directory, "victim"), os.path.join(directory, "world_writable")
    for path, mode in ((file, 0o644), (writable, 0o666)):
        with open(path, "w") as f:
            f.write("host data\n")
        os.chmod(path, mode)
    os.setxattr(file, "user.keep", b"kept")
    parent = pids_cgroup_parent()
    cgroup_dir = os.path.join(parent, f"mathrl_victim_{uuid.uuid4().hex[:12]}") if parent else None
    if cgroup_dir:
        os.mkdir(cgroup_dir)
    cgroup_file = os.path.join(cgroup_dir, "cgroup.procs") if cgroup_dir else ""
    placeholders = dict(
        file=file, writable=writable, directory=directory, cgroup_file=cgroup_file, mount_point=sys.prefix
    )
    watched = [file, writable, directory] + ([cgroup_file, cgroup_dir] if cgroup_dir else [])
    yield placeholders, watched
    for path in (file, writable, directory):
        cleanup.clear_inode_flags(path)
    shutil.rmtree(directory, ignore_errors=True)
    if cgroup_dir:
        os.rmdir(cgroup_dir)


def _attack(isolation, victims, touch_dev_null=True):
    placeholders, watched = victims
    before = {path: _snapshot(path, xattrs=not path.startswith("/sys")) for path in watched}
    dev_null = _snapshot("/dev/null", xattrs=False)
    code = HOOK_OFF + ATTACKS.format(touch_dev_null=touch_dev_null, **placeholders)
    result = run_python(code, LIMITS, isolation=isolation)
    assert "hook-off" in result.stdout, (result.status, result.stdout, result.stderr[-800:])
    gained = {line.split()[0] for line in result.stdout.splitlines() if line.endswith("GAINED")}
    changed = {path for path in watched if _snapshot(path, xattrs=not path.startswith("/sys")) != before[path]}
    if _snapshot("/dev/null", xattrs=False) != dev_null:
        changed.add("/dev/null")
    return result, gained, changed


def _without(isolation, *layers):
    return dataclasses.replace(isolation, **{layer: 0 if layer == "landlock_abi" else False for layer in layers})


@pytest.mark.parametrize("isolation", CONTAINED_MODES)
def test_no_host_file_metadata_changes_and_no_namespace_is_made(isolation, victims):
    """Every mode that runs model code by default: each metadata attack refused, every victim unchanged
    (mode, owner, times, attributes, flags), no new user namespace. Before issue 60's fix the program gained
    `chmod_setuid`, `file_capability` and the others here (`test_the_metadata_attacks_are_real` shows it)."""
    result, gained, changed = _attack(isolation, victims)
    assert gained == set() and changed == set(), (gained, changed, result.stdout)
    for what in METADATA - {"cgroup_chmod"}:
        assert f"{what} refused" in result.stdout, (what, result.stdout)
    for what in NAMESPACES:
        assert f"{what} refused" in result.stdout, (what, result.stdout)
    assert f"uid {privileges.SANDBOX_ID}" in result.stdout or not isolation.unprivileged_uid


_NS = (
    None if AVAILABLE.namespaces and AVAILABLE.seccomp and AVAILABLE.unprivileged_uid
    else f"needs namespaces, seccomp and a uid to drop to, have {AVAILABLE.name}"
)  # fmt: skip
_NO_NS = (
    None if AVAILABLE.seccomp and AVAILABLE.landlock_abi and NO_NAMESPACES.unprivileged_uid
    else f"needs Landlock, seccomp and a uid to drop to, have {NO_NAMESPACES.name}"
)  # fmt: skip


def _case(id, needs, removed, base, gaps=frozenset()):
    return pytest.param(base, removed, gaps, id=id, marks=pytest.mark.skipif(needs is not None, reason=needs or ""))


LAYER_CASES = [
    # One layer removed: the other two hold every attack.
    _case("namespaces-without-seccomp", _NS, ("seccomp",), AVAILABLE),
    _case("namespaces-without-uid", _NS, ("unprivileged_uid",), AVAILABLE),
    _case("namespaces-without-read-only-roots", _NS, ("read_only_roots",), AVAILABLE),
    _case("no-namespaces-without-uid", _NO_NS, ("unprivileged_uid",), NO_NAMESPACES),
    # Without namespaces there are two layers: the uid alone cannot keep the times of a world-writable file
    # (utime to "now" needs only write access): seccomp is needed with it for those.
    _case("no-namespaces-without-seccomp", _NO_NS, ("seccomp",), NO_NAMESPACES, {"world_writable_times"}),
    # Each layer alone, to say which pairs are needed: seccomp holds alone; the uid alone loses the times of
    # world-writable files; read-only mounts hold alone because the program keeping the caller's uid (the root of
    # a user namespace) has no capability left to remount them or clear their flag (`mount_setattr`, which
    # Landlock does not govern: found in review), with Landlock or without.
    _case("namespaces-seccomp-alone", _NS, ("unprivileged_uid", "read_only_roots"), AVAILABLE),
    _case("namespaces-uid-alone", _NS, ("seccomp", "read_only_roots"), AVAILABLE, {"world_writable_times"}),
    _case("namespaces-read-only-roots-alone", _NS, ("seccomp", "unprivileged_uid"), AVAILABLE),
    _case(
        "namespaces-read-only-roots-alone-without-landlock",
        _NS,
        ("seccomp", "unprivileged_uid", "landlock_abi"),
        AVAILABLE,
    ),
]


@pytest.mark.parametrize("base, removed, gaps", LAYER_CASES)
def test_with_a_layer_removed_the_others_hold(base, removed, gaps, victims):
    """The layers one by one: with any one removed the others refuse every metadata attack; alone, each holds
    all but the gaps named (which a second layer closes). A gap's change is allowed to the world-writable
    victim alone; `/dev/null` is left out where a gap would reach it."""
    isolation = _without(base, *removed)
    placeholders, _ = victims
    result, gained, changed = _attack(isolation, victims, touch_dev_null=not gaps)
    assert gained & METADATA == set(gaps), (isolation.name, gained, result.stdout)
    allowed = {placeholders["writable"]} if "world_writable_times" in gaps else set()
    if "remount_then_chmod" in gaps:
        allowed.add(placeholders["file"])
    assert changed <= allowed, (isolation.name, changed, result.stdout)


@pytest.mark.skipif(_NS is not None, reason=_NS or "")
def test_the_metadata_attacks_are_real(victims):
    """With all three layers off (a namespaced run as before issue 60: root of a user namespace mapped to the
    host's root, over writable bind mounts, no metadata filter; only its capabilities dropped, which keep it from
    `security.capability`) the same program still owns the host's files and gives the victim the set-user-ID bit:
    the tests above attack for real."""
    placeholders, _ = victims
    isolation = _without(AVAILABLE, "seccomp", "unprivileged_uid", "read_only_roots")
    result, gained, changed = _attack(isolation, victims, touch_dev_null=False)
    assert {"chmod_setuid", "utime", "removexattr", "cgroup_chmod"} <= gained, result.stdout
    assert placeholders["file"] in changed and os.stat(placeholders["file"]).st_mode & stat.S_ISUID


@pytest.mark.skipif(_NS is not None, reason=_NS or "")
def test_a_set_user_id_program_gains_nothing(victims):
    """A set-user-ID root program in a readable root (the review's end point: a binary that makes its caller
    root) runs as the program's own uid: `nosuid` mounts and `no_new_privs` each ignore the bit. Checked
    with the read-only roots (and `nosuid`) on and off: `no_new_privs` holds alone."""
    placeholders, _ = victims
    target = os.path.join(placeholders["directory"], "id_setuid")
    shutil.copy(shutil.which("id"), target)
    os.chmod(target, 0o4755)
    code = f"import subprocess\nprint(subprocess.run([{target!r}, '-u'], capture_output=True, text=True).stdout)"
    for isolation in (AVAILABLE, _without(AVAILABLE, "read_only_roots")):
        result = run_python(code, LIMITS, isolation=isolation)
        assert result.ok and result.stdout.split() == [str(privileges.SANDBOX_ID)], (isolation.name, result)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root holds CAP_LINUX_IMMUTABLE")
def test_an_immutable_file_in_the_run_directory_leaves_nothing_behind(tmp_path):
    """No layer lets a program mark a file immutable any more (no `CAP_LINUX_IMMUTABLE` in any mode, the ioctls
    refused), but the run's directory is the host's: an immutable file and an append-only directory in it, as
    root's program could make before, are removed with it, not left with their data while the run says "ok"."""
    base = tmp_path / "mathrl_sandbox_run"
    (base / "work" / "sub").mkdir(parents=True)
    for path in (base / "work" / "kept", base / "work" / "sub" / "kept"):
        path.write_text("data")
    fd = os.open(base / "work" / "kept", os.O_RDONLY)
    fcntl.ioctl(fd, 0x40086602, struct.pack("i", 0x10))  # FS_IOC_SETFLAGS: immutable
    os.close(fd)
    fd = os.open(base / "work" / "sub", os.O_RDONLY)
    fcntl.ioctl(fd, 0x40086602, struct.pack("i", 0x20))  # append-only
    os.close(fd)
    assert cleanup.remove_tree(str(base)) == "" and not base.exists()


def test_a_cleanup_that_fails_is_reported_not_ok(monkeypatch):
    """If the run's directory cannot be removed, the result says so: status "sandbox_error", the directory named;
    never "ok" over data left on the host."""
    from mathrl_jax.envs.sandbox import host

    left = []

    def fails(path):
        left.append(path)
        cleanup.remove_tree(path)
        return "1 entries left (kept: Operation not permitted)"

    monkeypatch.setattr(host, "remove_tree", fails)
    result = run_python("print('done')", LIMITS)
    assert result.status == "sandbox_error" and f"{left[0]} could not be removed: 1 entries left" in result.stderr


SETXATTRAT = """
import ctypes, errno, os, sys
sys.path.insert(0, {sandbox_dir!r})
import seccomp

if sys.argv[1] == "filtered":
    seccomp.apply_seccomp(os.getpid(), processes_allowed=True, threads_allowed=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

class XattrArgs(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("size", ctypes.c_uint32), ("flags", ctypes.c_uint32)]

value = ctypes.create_string_buffer(b"x", 1)
args = XattrArgs(ctypes.addressof(value), 1, 0)
size = ctypes.c_size_t(16)
result = libc.syscall(463, ctypes.c_long(-100), {path!r}.encode(), 0, b"user.mathrl", ctypes.byref(args), size)
print(result, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()) if result else "-")
"""


def test_a_call_newer_than_libseccomp_is_refused_not_let_through(tmp_path):
    """A deny-list by name lets through what the library does not know: `setxattrat` (463, Linux 6.13) is a
    metadata call libseccomp 2.5.4 cannot name. Unfiltered, it sets an attribute here; under the filter it is
    answered ENOSYS and the file keeps no attribute."""
    from mathrl_jax.envs.sandbox import seccomp

    if not detect_isolation().seccomp or 463 not in seccomp.unknown_syscalls():
        pytest.skip("no libseccomp here, or one that names setxattrat (refused by name, FILE_METADATA)")
    target = tmp_path / "file"
    target.write_text("data")
    script = SETXATTRAT.format(sandbox_dir=os.path.dirname(seccomp.__file__), path=str(target))
    unfiltered = subprocess.run([sys.executable, "-c", script, "unfiltered"], capture_output=True, text=True)
    if unfiltered.stdout.split() != ["0", "-"]:
        pytest.skip(f"this kernel has no setxattrat: {unfiltered.stdout.strip()} {unfiltered.stderr[-200:]}")
    os.removexattr(target, "user.mathrl")
    filtered = subprocess.run([sys.executable, "-c", script, "filtered"], capture_output=True, text=True)
    assert filtered.stdout.split() == ["-1", "ENOSYS"], (filtered.stdout, filtered.stderr[-500:])
    assert os.listxattr(target) == []


@pytest.mark.skipif(_NS is not None, reason=_NS or "")
def test_the_python_tool_holds_the_metadata_attacks(victims):
    """The path a training run takes: the attack as a model's tool call (`PythonToolEnv`, default isolation)."""
    placeholders, watched = victims
    before = {path: _snapshot(path, xattrs=not path.startswith("/sys")) for path in watched}
    env = PythonToolEnv(MathEnv([Problem(uid="p", question="1+1?", answer="2")]), limits=LIMITS)
    env.reset(seed=0)
    code = HOOK_OFF + ATTACKS.format(touch_dev_null=True, **placeholders)
    observation, *_ = env.step(f"<python>\n{code}\n</python>")
    assert "hook-off" in observation and "GAINED" not in observation, observation
    assert "chmod_setuid refused" in observation and "file_capability refused" in observation
    assert {path: _snapshot(path, xattrs=not path.startswith("/sys")) for path in watched} == before


REMOUNT = """
import ctypes, os, sys
sys.path.insert(0, {sandbox_dir!r})
import private_root

source, target = {source!r}, {target!r}
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mount(b"tmpfs", (source + "/sub").encode(), b"tmpfs", 0, None) == 0  # a submount, bound with it
open(source + "/sub/existing", "w").close()
os.makedirs(target)
private_root._bind(source, target)
private_root.remount_read_only(target, nodev=True)
for what, action in (
    ("write", lambda: open(target + "/new", "w")),
    ("chmod", lambda: os.chmod(target + "/existing", 0o4777)),
    ("submount-write", lambda: open(target + "/sub/new", "w")),
    ("submount-chmod", lambda: os.chmod(target + "/sub/existing", 0o4777)),
):
    try:
        action()
        print(what, "GAINED")
    except OSError as error:
        print(what, error.errno)
"""


@pytest.mark.parametrize("user_namespace", [False, True], ids=["root", "user-namespace"])
def test_the_remount_fallback_makes_every_bind_read_only(tmp_path, user_namespace):
    """Kernels before 5.12 have no `mount_setattr`: each mount below the bind is remounted read-only, repeating
    the flags the kernel locked on it (in a user namespace it refuses to clear them). EROFS for writes and mode
    changes through the bind and through a submount bound with it."""
    from mathrl_jax.envs.sandbox import isolation

    if not AVAILABLE.namespaces or (not user_namespace and not AVAILABLE.unprivileged_uid):
        pytest.skip(f"no such namespaces here ({AVAILABLE.name})")
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "existing").write_text("host data")
    flags = isolation.unshare_flags(unprivileged_uid=not user_namespace)
    script = REMOUNT.format(
        sandbox_dir=os.path.dirname(cleanup.__file__), source=str(source), target=str(tmp_path / "target")
    )
    run = subprocess.run(["unshare", *flags, "--", sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:4] == ["write 30", "chmod 30", "submount-write 30", "submount-chmod 30"], run.stdout
    assert stat.S_IMODE((source / "existing").stat().st_mode) == 0o644


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root, setpriv and a system python3 to run the cleanup as another user",
)
def test_a_directory_the_program_made_unreadable_is_removed_by_a_non_root_host():
    """A non-root caller's run (no uid to drop to): the program makes `d` with mode 0300 (no read bit) and writes
    a file in it. The host, the same non-root user, cannot list `d`: `remove_tree` opens it up and removes it.
    Before (found in review), rmtree's retry called `os.open` without flags: a TypeError out of `run_python`."""
    owner = 65534
    scratch = tempfile.mkdtemp(prefix="mathrl_cleanup_test_")  # pytest's tmp_path is root's alone (0700)
    os.chmod(scratch, 0o777)
    shutil.copy(cleanup.__file__, os.path.join(scratch, "cleanup.py"))
    base = os.path.join(scratch, "run")
    script = (
        "import os, sys\nsys.path.insert(0, sys.argv[1])\nimport cleanup\n"
        "os.makedirs(sys.argv[2] + '/work/d/e')\nopen(sys.argv[2] + '/work/d/e/x', 'w').write('data')\n"
        "os.chmod(sys.argv[2] + '/work/d/e', 0o300)\nos.chmod(sys.argv[2] + '/work/d', 0o300)\n"
        "print(repr(cleanup.remove_tree(sys.argv[2])), os.path.exists(sys.argv[2]))"
    )
    command = ["setpriv", f"--reuid={owner}", f"--regid={owner}", "--clear-groups", "/usr/bin/python3", "-I", "-c"]
    try:
        run = subprocess.run([*command, script, scratch, base], capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(scratch)
    assert run.returncode == 0 and run.stdout.split() == ["''", "False"], (run.stdout, run.stderr[-800:])


CAPABILITIES = "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])"


@pytest.mark.skipif(_NS is not None, reason=_NS or "")
def test_a_callers_umask_does_not_close_the_private_root_to_the_programs_uid():
    """Found in review: under a caller's umask 027 the private root's directories were made 0750, closed to the
    program's uid, which then kept CAP_DAC_READ_SEARCH to reach its interpreter (and read root's 0600 files).
    The supervisor makes them with umask 022: no capability is kept, whatever the caller's umask."""
    previous = os.umask(0o027)
    try:
        result = run_python(CAPABILITIES, LIMITS, isolation=AVAILABLE)
    finally:
        os.umask(previous)
    assert result.ok and result.stdout.split() == ["0000000000000000"], result


@pytest.mark.parametrize("isolation", CONTAINED_MODES)
def test_a_program_keeping_the_callers_uid_has_no_capability(isolation):
    """Without the uid layer (a non-root caller's user namespace; here the same namespaces as root), the program's
    capabilities are dropped: none to clear its mounts' read-only flag with `mount_setattr` (found in review),
    none over files it does not own."""
    result = run_python(CAPABILITIES, LIMITS, isolation=_without(isolation, "unprivileged_uid"))
    assert result.ok and result.stdout.split() == ["0000000000000000"], result


@pytest.mark.skipif(not AVAILABLE.seccomp, reason="no libseccomp here")
def test_the_parent_death_signal_cannot_be_cleared_through_the_upper_bits():
    """Found in review: the kernel reads prctl's option as 32 bits, and the filter compared 64: `prctl(1 | 1 << 32,
    0)` cleared the parent-death signal where processes are refused. The filter compares the low 32 bits."""
    code = HOOK_OFF + (
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "print(libc.syscall(157, ctypes.c_ulong(0x100000001), 0, 0, 0, 0), ctypes.get_errno())\n"
        "signal = ctypes.c_int(-1)\nlibc.prctl(2, ctypes.byref(signal))\nprint(signal.value)"  # PR_GET_PDEATHSIG
    )
    result = run_python(code, LIMITS, isolation=NO_NAMESPACES)
    assert result.stdout.split()[1:] == ["-1", "1", "9"], result  # refused (EPERM), SIGKILL still set
