"""Runs untrusted Python (model-generated code) in a confined child process.

`run_python(code, limits)` starts a fresh interpreter in a temporary working
directory with a cleaned environment and returns its (truncated) stdout,
stderr and a `status` naming the limit that stopped it. Model-generated code is
hostile input: it only ever runs through here.

Layers, each used where the machine offers it (`detect_isolation`):

- rlimits (always): CPU seconds (`RLIMIT_CPU`), address space (`RLIMIT_AS`, per
  process), file size (`RLIMIT_FSIZE`), open files; no core files.
- wall clock (always): the process group (and namespace, and cgroup) is SIGKILLed
  at `wall_time_s`.
- bounded capture (always): at most `max_output_bytes` of stdout and of stderr are
  kept; more ends the run ("output_limit").
- namespaces (`unshare`): fresh pid, net, mount, ipc, uts and cgroup namespaces (and a
  user namespace whose root is the caller, where the caller is not root). No network but a
  down loopback; `/proc` shows only the sandbox's processes; everything dies with the
  namespace's first process; the file system is a private root (`pivot_root`) holding
  only the readable roots (bind mounts) and a tmpfs working directory of `disk_bytes`: no
  host path outside them exists in there, so no host pathname UNIX socket can be named
  (Landlock does not govern `connect` on those, nor does the network namespace).
- pids cgroup (a writable v1 or v2 pids controller): at most `max_processes`
  processes and threads.
- memory cgroup (a writable v1 or v2 memory controller): `memory_bytes` for the whole
  run, all its processes together (status "memory" when the OOM killer acts).
  Without one the memory limit is `RLIMIT_AS`, per process.
- Landlock (Linux >= 5.13): writes only inside the working directory; reads and
  exec only of system and interpreter directories; no mount changes; no TCP bind
  or connect (ABI >= 4); no signals or abstract sockets outside the sandbox (ABI >= 6).
  Where processes are refused, no `execve` of any file either: the kernel's stop for
  a process that native code starts without an audit event.
- unprivileged uid (a root caller): the program runs as `privileges.SANDBOX_ID`, a uid and gid
  that own nothing on the host, without capabilities and with `no_new_privs`: it can change
  no host file's mode, owner, times, attributes or flags (Landlock governs none of those).
  The namespaces of a root caller are then made without a user namespace.
- read-only roots (namespaces): the private root's bind mounts are read-only and `nosuid`.
- seccomp-bpf (libseccomp, `seccomp.py`): in every mode no metadata call (`chmod`, `chown`,
  `setxattr`, `utime` families, the inode-flag ioctls), no new namespaces, no call newer than
  libseccomp; wherever processes are refused, also no sockets, no
  `execve`, no new processes (threads only under a pids cgroup), nothing done to another
  process (signals, `prlimit`, priorities, scheduling, `pidfd_*`, `ptrace`), no leaving the
  process group; in every mode no host IPC, `io_uring`, keyrings, device nodes, file
  handles, mounts, modules. The wall the program meets once it switches the audit hook off.
- audit hook (always, PEP 578): refuses, with a `SandboxViolation` naming the
  operation, network calls, writes outside the working directory, reads outside
  it and the system / interpreter directories (so: no raw disks, no other
  processes' `/proc` entries, no caller's files) and symlinks; and, wherever the
  kernel does not cap them, process creation and `ctypes` calls. Paths are resolved
  as the kernel walks them (symlinks, `..`, `/proc/self`) before they are checked,
  and no path through a `/proc/<pid>/{root,cwd,fd/<n>/...}` magic link is opened.
- native extension allow-list (where processes are refused): only the standard
  library's extension modules (`lib-dynload`, less CPython's test modules) load;
  native code acts without audit events (uvloop spawns a shell through libuv), and an
  allow-list does not depend on knowing every package that spawns.

Reads of system directories (`/etc`, `/usr`, ...) stay allowed: keep secrets out of them.
What each mode guarantees, and the escapes tested against each: docs/sandbox.md.

The audit hook (PEP 578) is not a security boundary on its own (the PEP says
so; a program switches it off with `ctypes` writes to its own objects): it is the
refusal layer that names what was refused. Model code runs only where the kernel
contains it without the hook (`Isolation.contains`): namespaces, or Landlock and
seccomp; elsewhere `run_python` refuses unless told `allow_not_a_sandbox=True`.
The program's process dies with the supervisor (`PR_SET_PDEATHSIG`), and the host's
kill at the time limit walks the supervisor's descendants. Processes (and `ctypes`) are
allowed only where the kernel confines what they could do without the hook:
namespaces + a process cap + Landlock. Otherwise `os.fork`, `subprocess`,
`os.system`, `os.exec*`, `posix_spawn` are refused (`status="process_limit"`).

`RLIMIT_NPROC` never binds a process whose real uid is root (not even inside a user
namespace mapped to root), and counts per uid (every run shares `SANDBOX_ID`), so the
process cap is the pids cgroup (or, for a non-root caller, `RLIMIT_NPROC` in the fresh
user namespace).

GEM's python tool (axon-rl/gem `gem/tools/python_code_tool.py`) runs code with
`subprocess.run(["python3", file], timeout=5)` in a shared directory with a
filtered environment; this package keeps its 5 s default and its cleaned
environment and adds the limits above.

Modules. Host side (the caller's process):

- `limits`: `SandboxLimits` (what one run may use) and `Isolation` (which layers confine it).
- `result`: `SandboxResult` and `STATUSES`, what one run reports.
- `cgroup`: finding pids / memory cgroup parents, and the per-run `PidsCgroup` and `MemoryCgroup`.
- `isolation`: `detect_isolation` (unshare, cgroup, Landlock probes) and checking a request against it.
- `outcome`: the supervisor's status report and the host's kill reason, turned into a status.
- `host`: `run_python`, which starts the entry script and collects its output under the limits.
- `cleanup`: removing the run's directory (inode flags cleared) and saying what could not be removed.

Child side (the sandbox's interpreter; standard library only, never `subprocess`):

- `child`: the entry script, run by path: the pid-1 supervisor and the user program's
  process (private root, rlimits, stand-ins, then `exec`); defines `SandboxViolation`.
- `audit`: the audit hook and what it refuses; the readable system paths.
- `extension_guard`: the native extension guard and `STANDARD_EXTENSIONS`, what it lets load.
- `private_root`: the namespace's own root file system (bind mounts, tmpfs, `pivot_root`).
- `landlock`: Landlock ABI detection (also used by the host) and its ruleset.
- `seccomp`: the seccomp-bpf filter over libseccomp, and its detection (also used by the host).
- `privileges`: the uid that owns nothing (`SANDBOX_ID`), dropping to it, `no_new_privs` (also used by the host).

Imports go one way: the host side imports the child side's modules (for the entry
script's path, `READ_ROOTS`, `landlock_abi`, `seccomp_available`, `SANDBOX_ID`), never the reverse; `child`
loads `audit`, `extension_guard`, `landlock`, `private_root`, `privileges` and `seccomp` by path when it runs, so
none of those imports a sibling.
"""

from mathrl_jax.envs.sandbox.cgroup import memory_cgroup_parent, pids_cgroup_parent
from mathrl_jax.envs.sandbox.child import SandboxImportViolation, SandboxViolation
from mathrl_jax.envs.sandbox.host import run_python
from mathrl_jax.envs.sandbox.isolation import detect_isolation, require_isolation
from mathrl_jax.envs.sandbox.landlock import landlock_abi
from mathrl_jax.envs.sandbox.limits import Isolation, SandboxLimits
from mathrl_jax.envs.sandbox.result import STATUSES, SandboxResult

__all__ = [
    "STATUSES",
    "Isolation",
    "SandboxImportViolation",
    "SandboxLimits",
    "SandboxResult",
    "SandboxViolation",
    "detect_isolation",
    "landlock_abi",
    "memory_cgroup_parent",
    "pids_cgroup_parent",
    "require_isolation",
    "run_python",
]
