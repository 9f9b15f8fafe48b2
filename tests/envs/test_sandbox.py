"""The sandbox against hostile programs: each is stopped or refused, the host is untouched, the status names the limit.

Every acceptance case runs twice: with the strongest isolation this machine offers
and with the audit hook alone (what is left when `unshare`, cgroups, Landlock and seccomp
are all missing; not a sandbox, run here opted in: `sandbox_modes.run_python`). Limits
are tight so the fork bomb and the 10 GB allocation cannot hurt a shared machine.
"""

import concurrent.futures
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from mathrl_jax.envs.sandbox import Isolation, SandboxLimits, detect_isolation
from mathrl_jax.envs.sandbox import child as sandbox  # the entry script, whose path the tests look for
from tests.envs.sandbox_modes import AUDIT_ONLY, AVAILABLE, run_python, sandbox_processes

CLEANUP_S = 10.0  # a stopped run's kill and reaping, on a loaded machine: a hang would take far longer (60 s sleeps)
TIGHT = SandboxLimits(
    wall_time_s=3.0,
    cpu_time_s=1,
    memory_bytes=256 << 20,
    file_size_bytes=1 << 20,
    disk_bytes=4 << 20,
    max_processes=8,
    max_output_bytes=4096,
)
MODES = [pytest.param(AVAILABLE, id=AVAILABLE.name)]
if AVAILABLE != AUDIT_ONLY:
    MODES.append(pytest.param(AUDIT_ONLY, id="audit-hook-only-not-a-sandbox"))
needs_kernel_confinement = pytest.mark.skipif(
    not AVAILABLE.processes_allowed, reason=f"needs namespaces + pids cgroup + Landlock, have {AVAILABLE.name}"
)


@pytest.fixture(params=MODES)
def isolation(request):
    return request.param


@pytest.fixture
def no_leftovers():
    before = sandbox_processes()
    yield
    deadline = time.monotonic() + 2.0
    while sandbox_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() - before == set()


@pytest.fixture
def listener():
    """A TCP server on the host's loopback; the test asserts no sandbox ever reaches it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    yield server
    try:
        connection, _ = server.accept()
    except (socket.timeout, BlockingIOError):
        connection = None
    server.close()
    assert connection is None, "a sandboxed program connected to a host socket"


# --------------------------------------------------------------------------- ordinary programs


def test_runs_code_and_reports_output_exit_code_and_stdin(isolation):
    result = run_python(
        "import sys\nline = input()\nprint(line[::-1], sum(range(10)))", TIGHT, stdin="abc\n", isolation=isolation
    )
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, f"cba {sum(range(10))}\n")
    assert result.ok and result.isolation == isolation

    result = run_python("import sys\nprint('partial')\nsys.exit(3)", TIGHT, isolation=isolation)
    assert (result.status, result.returncode, result.stdout) == ("error", 3, "partial\n")


def test_uncaught_exception_is_an_error_with_the_programs_traceback_only(isolation):
    result = run_python("def f():\n    return 1 / 0\nf()", TIGHT, isolation=isolation)
    assert result.status == "error" and result.returncode == 1
    assert "ZeroDivisionError" in result.stderr and 'File "<sandbox>", line 2, in f' in result.stderr
    assert sandbox.__file__ not in result.stderr


def test_working_directory_is_private_writable_and_removed(isolation):
    code = "import os\nopen('a.txt', 'w').write('x')\nos.mkdir('d')\nprint(os.getcwd())\nprint(sorted(os.listdir()))"
    result = run_python(code, TIGHT, isolation=isolation)
    assert result.status == "ok", result.stderr
    workdir, listing = result.stdout.splitlines()
    assert listing == "['a.txt', 'd']"  # nothing of the host's in it
    assert not os.path.exists(workdir)


def test_sympy_is_importable(isolation):
    result = run_python("import sympy\nprint(sympy.factorint(360))", SandboxLimits(), isolation=isolation)
    assert result.status == "ok", result.stderr
    assert result.stdout.strip() == str({2: 3, 3: 2, 5: 1})
    assert result.violations == ()  # importing touched nothing the hook refuses


# --------------------------------------------------------------------------- hostile programs


def test_infinite_loop_is_stopped_by_the_cpu_limit(isolation, no_leftovers):
    # A wall clock far past the CPU limit: on a loaded machine the loop gets a fraction of a core, and TIGHT's 3 s
    # wall clock fired first (a CI run beside two others: "timeout", not "cpu_time").
    limits = dataclasses.replace(TIGHT, wall_time_s=60.0)
    start = time.monotonic()
    result = run_python("while True:\n    pass", limits, isolation=isolation)
    assert result.status == "cpu_time" and result.signal in (signal.SIGXCPU, signal.SIGKILL)
    # The kernel's CPU accounting is tick-based: the child's rusage can read ~10% under the limit that fired.
    assert result.cpu_time_s >= TIGHT.cpu_time_s * 0.5
    assert time.monotonic() - start < limits.wall_time_s


def test_sleeping_program_is_stopped_by_the_wall_clock(isolation, no_leftovers):
    limits = SandboxLimits(wall_time_s=1.0, cpu_time_s=5)
    start = time.monotonic()
    result = run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", limits, isolation=isolation)
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and result.returncode is None
    assert result.stdout == "started\n"  # output before the kill is kept
    assert 1.0 <= elapsed < 1.0 + CLEANUP_S


def test_fork_bomb_is_stopped(isolation, no_leftovers):
    start = time.monotonic()
    result = run_python("import os\nwhile True:\n    os.fork()", TIGHT, isolation=isolation)
    assert result.status == "process_limit", (result.status, result.stderr[-500:])
    assert time.monotonic() - start < TIGHT.wall_time_s + CLEANUP_S


def test_allocating_10_gb_is_stopped(isolation, no_leftovers):
    result = run_python("x = bytearray(10 * 1024**3)\nprint('allocated')", TIGHT, isolation=isolation)
    assert result.status == "memory" and "MemoryError" in result.stderr
    assert result.stdout == ""


def test_writing_a_huge_file_is_stopped(isolation, no_leftovers):
    code = "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'0' * 65536)"
    result = run_python(code, TIGHT, isolation=isolation)
    assert result.status == "file_size", (result.status, result.stderr[-300:])


@pytest.mark.skipif(not AVAILABLE.namespaces, reason="the working-directory size limit is a tmpfs in a mount namespace")
def test_many_files_are_stopped_by_the_disk_limit(no_leftovers):
    # Each file is under RLIMIT_FSIZE; together they pass the 4 MB tmpfs.
    code = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'0' * (900 << 10))\nprint('wrote all')"
    result = run_python(code, TIGHT, isolation=AVAILABLE)
    assert result.status == "file_size" and "wrote all" not in result.stdout


def test_network_connection_is_refused(isolation, listener, no_leftovers):
    port = listener.getsockname()[1]
    result = run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", TIGHT, isolation=isolation
    )
    assert result.status == "network", (result.status, result.stderr[-300:])
    result = run_python(
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)", TIGHT, isolation=isolation
    )
    assert result.status == "network"
    assert any(v.startswith("network:") for v in result.violations)


def test_callers_environment_is_not_visible(isolation, monkeypatch, no_leftovers):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("MATHRL_SANDBOX_TEST_SECRET", secret)
    code = f"""
import os
print(dict(os.environ))
paths = ['/proc/self/environ', '/proc/{os.getpid()}/environ', f'/proc/{{os.getppid()}}/environ']
paths += [f'/proc/{{p}}/environ' for p in os.listdir('/proc') if p.isdigit()]
for path in paths:
    try:
        print(path, open(path, 'rb').read())
    except Exception as e:
        print(path, 'refused:', type(e).__name__)
"""
    result = run_python(code, SandboxLimits(max_output_bytes=1 << 20), isolation=isolation)
    assert result.status == "ok", result.stderr[-300:]
    assert "MATHRL_SANDBOX_TEST_SECRET" not in result.stdout and secret not in result.stdout
    assert "'PATH'" in result.stdout  # the program did see its own (clean) environment


def test_writing_outside_the_working_directory_is_refused(isolation, tmp_path, no_leftovers):
    attempts = {
        "open": "open({p!r}, 'w').write('x')",
        "os.open": "import os\nos.open({p!r}, os.O_WRONLY | os.O_CREAT)",
        "pathlib": "import pathlib\npathlib.Path({p!r}).write_text('x')",
        "mkdir": "import os\nos.mkdir({p!r})",
        "relative": "open('../../' + {name!r}, 'w').write('x')",
        "rename": "open('inside', 'w').write('x')\nimport os\nos.rename('inside', {p!r})",
    }
    for what, template in attempts.items():
        target = tmp_path / f"outside_{what}"
        result = run_python(template.format(p=str(target), name=target.name), TIGHT, isolation=isolation)
        assert result.status == "filesystem", (what, result.status, result.stderr[-300:])
        assert not target.exists(), what


def test_reading_host_files_and_raw_devices_is_refused(isolation, tmp_path):
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host-only-content")
    raw = [d for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/loop0", "/dev/kmsg") if os.path.exists(d)]
    for path in [str(secret), *raw[:1]]:
        result = run_python(f"print(open({path!r}, 'rb').read(64))", TIGHT, isolation=isolation)
        assert result.status == "filesystem" and "host-only-content" not in result.stdout, (path, result.stderr)
    result = run_python("print(len(open('/etc/passwd').read()) > 0, open('/dev/urandom', 'rb').read(4) != b'')", TIGHT)
    assert result.stdout == "True True\n"  # system files and the usual devices stay readable


def test_printing_forever_is_bounded(isolation, no_leftovers):
    result = run_python("while True:\n    print('x' * 1000)", TIGHT, isolation=isolation)
    assert result.status == "output_limit" and result.stdout_truncated
    assert len(result.stdout.encode()) == TIGHT.max_output_bytes


def test_a_caught_refusal_is_still_recorded(isolation):
    code = (
        "import socket\ntry:\n    socket.create_connection(('10.0.0.1', 80))\nexcept OSError:\n    print('no network')"
    )
    result = run_python(code, TIGHT, isolation=isolation)
    assert result.status == "ok" and result.stdout == "no network\n"
    assert [v.split(":")[0] for v in result.violations] == ["network"]


def test_audit_hook_cannot_be_rewired_from_python(isolation):
    code = """
import gc, sys
hooks = [o for o in gc.get_objects() if getattr(o, '__name__', '') == 'hook' and hasattr(o, '__defaults__')]
for h in hooks:
    h.__code__ = (lambda *a: None).__code__
"""
    result = run_python(code, TIGHT, isolation=isolation)
    assert result.status == "forbidden", (result.status, result.stderr[-300:])


# --------------------------------------------------------------------------- kernel layers (no audit hook)


@needs_kernel_confinement
def test_child_processes_are_confined_without_the_audit_hook(tmp_path, listener, no_leftovers):
    """Exec'd programs have no audit hook: the namespaces and Landlock must stop them."""
    port = listener.getsockname()[1]
    target = tmp_path / "written_by_child"
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host-only-content")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        net = (
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    print('connected')\nexcept OSError as e:\n    print('errno', e.errno)"
        )
        code = f"""
import subprocess, sys
print(subprocess.run([sys.executable, '-c', {net!r}], capture_output=True, text=True).stdout.strip())
print(subprocess.run(['/bin/sh', '-c', 'echo x > {target}'], capture_output=True, text=True).returncode)
print(subprocess.run(['kill', '-9', '{sleeper.pid}'], capture_output=True, text=True).returncode)
print(subprocess.run(['cat', '{secret}'], capture_output=True, text=True).stdout or 'unreadable')
"""
        result = run_python(code, SandboxLimits(wall_time_s=10), isolation=AVAILABLE)
        assert result.status == "ok", result.stderr[-500:]
        net, write, kill, read = result.stdout.splitlines()
        assert read == "unreadable"
        assert net.startswith("errno") and net != "connected"
        assert write != "0" and not target.exists()
        assert kill != "0" and sleeper.poll() is None  # the host process is alive
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_kernel_confinement
def test_shell_fork_bomb_is_capped_by_the_cgroup(no_leftovers):
    code = "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'b() { b | b & }; b; sleep 10'])"
    start = time.monotonic()
    result = run_python(code, TIGHT, isolation=AVAILABLE)
    # The shell's forks fail (it may then exit, or its `sleep` run into the wall clock); the cap is reported.
    assert result.status in ("ok", "timeout") and "process_limit" in [v.split(":")[0] for v in result.violations]
    assert time.monotonic() - start < TIGHT.wall_time_s + CLEANUP_S


# --------------------------------------------------------------------------- degraded isolation and API


def test_without_unshare_auto_degrades_to_the_audit_hook(monkeypatch, tmp_path):
    missing = detect_isolation(unshare=str(tmp_path / "no-such-unshare"))
    assert not missing.namespaces and not missing.processes_allowed
    result = run_python("import os\nos.fork()", TIGHT, isolation=missing)
    assert result.status == "process_limit" and result.isolation == missing
    assert "no process creation" in result.stderr


def test_unavailable_isolation_and_bad_arguments_raise_clear_errors():
    with pytest.raises(RuntimeError, match="landlock_abi=99"):
        run_python("pass", isolation=Isolation(namespaces=False, pids_cgroup=False, landlock_abi=99))
    with pytest.raises(ValueError, match="'bogus'"):
        run_python("pass", isolation="bogus")
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="memory_bytes must be a positive int, got -1"):
        SandboxLimits(memory_bytes=-1)
    with pytest.raises(ValueError, match="wall_time_s must be > 0, got 0"):
        SandboxLimits(wall_time_s=0)


def test_concurrent_runs_are_independent():
    codes = [f"print({i} * {i})" for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda code: run_python(code, TIGHT), codes))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(4)]


def test_sandbox_entry_script_imports_nothing_that_forks_unaudited():
    """The child side must not have `_posixsubprocess` loaded: it forks without an audit event."""
    probe = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import runpy, sys; runpy.run_path({sandbox.__file__!r}, run_name='probe'); "
            "print('_posixsubprocess' in sys.modules, 'subprocess' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["False", "False"]
