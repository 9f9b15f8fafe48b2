"""A reward function named in the config (`reward.functions`), run in a process of its own so that a call past
its time limit can be killed.

`FunctionProcess(spec)` starts a Python process (`python -c` importing this module) in a new session: the
process takes the parent's `sys.path` and working directory, loads the function as the parent would
(`function_loading.load_reward_function`: `module:function` or `path/file.py:function`) and then answers calls, one at a
time, over a socket, with `grading_process`'s framing. The parent waits for each answer with a deadline; past it
the process's whole group (the function's own children too) is killed with SIGKILL, and the next call starts a
fresh process (the module loaded again). The process dies with the parent (`PR_SET_PDEATHSIG`), and ends when
the parent closes the socket.

No process the function starts outlives the function's process: that process is a child subreaper
(`PR_SET_CHILD_SUBREAPER`), so a daemon the function starts (`subprocess.Popen(..., start_new_session=True)`, a
double fork, `setsid`) stays its descendant when its own parent exits, in whatever session or process group it
moved to. Every kill takes the process's descendants first (`kill_descendants`, over `/proc`), then its group, then
the process; at `close` the process, once its own exit handlers have run, kills what is left and reports how many
(`close` returns the count). A daemon that held the training program's stdout (`train.py | cat`) no longer keeps
the pipe open after the program exits. (What escapes: a process that left the function's process group, when
the function's process then ends without its exit handlers (`os._exit`, a crash, the parent's death); its
orphans are no longer in its tree. An orphan that ends stays a zombie of the function's process until that
process ends.)

What this costs the function: it runs in another interpreter, so it shares no state with the program that
trains (what it keeps in its own module persists from call to call until a kill); its arguments and its result
cross the socket pickled (a result that cannot be pickled, e.g. a generator, is reported as such). What it
gains: a hang in C code that holds the interpreter lock (a regular expression that backtracks without end) is
bounded too, which no thread of the training process could do.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback

from mathrl_jax.processes import kill_descendants
from mathrl_jax.rewards.function_loading import RewardFunctionError, load_reward_function
from mathrl_jax.rewards.grading_process import recv_message, send_message

_BOOTSTRAP = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from mathrl_jax.rewards.function_process import serve; serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4])"
)
"""The process's program: the parent's `sys.path` first (its modules found as there), then `serve`."""


_PR_SET_CHILD_SUBREAPER = 36


class FunctionProcessError(RewardFunctionError):
    """The function's process failed: `kind` is "timeout", "died", "raised", "unpicklable", "unreadable" or
    "load"; the message names the function (its spec) and what happened."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _truncated(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value) -> str:
    try:
        return _truncated(" ".join(repr(value).split()))
    except Exception:  # noqa: BLE001  a repr that fails says nothing about the result
        return f"<{type(value).__name__}>"


class FunctionProcess:
    """A reward function (`spec`, "module:function" or "path/file.py:function") in a killable process.

    process = FunctionProcess("examples/my_rewards.py:brevity")
    process.wait_ready(300.0)  # the module loaded (FunctionProcessError "load" if it does not)
    values = process.call({"prompts": [...], "completions": [...], ...}, timeout_s=60.0)
    process.close()
    """

    def __init__(self, spec: str):
        self.spec = spec
        self._named = f"reward function {spec!r}"
        self._process = None
        self._sock = None
        self._ready = False
        self._killed = 0  # the function's own processes (not the process itself) the last `kill` killed
        self.start()

    def start(self) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BOOTSTRAP,
                    str(child_end.fileno()),
                    str(os.getpid()),
                    json.dumps(sys.path),
                    self.spec,
                ],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a kill takes the function's children too
            )
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self._sock, self._ready = parent_end, False

    @property
    def pid(self):
        return None if self._process is None else self._process.pid

    def wait_ready(self, timeout_s: float) -> None:
        """Until the function is loaded; FunctionProcessError("load") with the loader's message if it is not."""
        if self._ready:
            return
        reply = self._receive(time.monotonic() + timeout_s, f"did not load within {timeout_s:g} s", loading=True)
        if reply[0] == "load_error":
            self.kill()
            raise FunctionProcessError("load", reply[1])
        self._ready = True

    def call(self, kwargs: dict, timeout_s: float, load_timeout_s: float = 300.0):
        """The function's result on `kwargs`, within `timeout_s` seconds (a killed process is started again
        first, its loading bounded by `load_timeout_s`, not counted in `timeout_s`)."""
        if self._process is None:
            self.start()
        self.wait_ready(load_timeout_s)
        deadline = time.monotonic() + timeout_s
        try:
            self._sock.settimeout(timeout_s)
            send_message(self._sock, kwargs)
        except TimeoutError:
            self.kill()
            raise FunctionProcessError(
                "timeout", f"{self._named} did not take its arguments within {timeout_s:g} s"
            ) from None
        except OSError:
            code = self.kill()
            raise FunctionProcessError("died", f"{self._named}: its process had exited (code {code})") from None
        status, value = self._receive(deadline, f"did not return within {timeout_s:g} s")
        if status == "ok":
            return value
        if status == "raised":
            raise FunctionProcessError("raised", f"{self._named} raised {value} (its traceback is above, on stderr)")
        raise FunctionProcessError("unpicklable", f"{self._named} returned {value}")

    def _receive(self, deadline: float, late: str, loading: bool = False):
        try:
            return recv_message(self._sock, deadline)
        except TimeoutError:
            self.kill()
            raise FunctionProcessError("timeout", f"{self._named} {late}") from None
        except (EOFError, OSError):
            code = self.kill()
            during = "while loading" if loading else "during the call"
            raise FunctionProcessError(
                "died", f"{self._named}: its process exited {during} (code {code}: os._exit, a crash, or out of memory)"
            ) from None
        except Exception as error:  # noqa: BLE001  unpickling the result: a class this process cannot import
            self.kill()
            raise FunctionProcessError(
                "unreadable",
                f"{self._named} returned a value this process cannot unpickle ({type(error).__name__}: {error})",
            ) from None

    def kill(self):
        """Kills the process's descendants (wherever they moved: `kill_descendants`), its group and the process
        (SIGKILL), and reaps it; returns its exit code (None if none ran)."""
        process, self._process, self._ready = self._process, None, False
        self._killed = 0
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if process is None:
            return None
        # First, while the process lives: it adopts every orphan of the function's (a subreaper), so none is missed.
        self._killed = kill_descendants(process.pid)
        try:  # before reaping: an unreaped leader keeps its pid, so the group id cannot be reused meanwhile
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return process.wait()

    def close(self, grace_s: float = 2.0) -> int:
        """Ends the process: EOF on the socket (it exits, running its exit handlers, and then kills the processes
        the function left running, `_end_leftovers`), then its descendants and group killed after `grace_s` (a
        call still running, a process that did not exit). Returns how many processes the function had left
        running (the process itself not counted)."""
        process = self._process
        if process is None:
            return 0
        end = time.monotonic() + grace_s
        left = 0
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_WR)
                while True:  # a reply to a call still running may come first
                    message = recv_message(self._sock, end)
                    if isinstance(message, tuple) and len(message) == 2 and message[0] == "leftovers":
                        left = int(message[1])
                        break
            except Exception:  # noqa: BLE001  past the grace, EOF (a process that ended otherwise): killed below
                pass
        while time.monotonic() < end:
            try:
                if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    break  # exited, not reaped yet: its group id stays reserved for the kill below
            except ChildProcessError:
                break
            time.sleep(0.02)
        self.kill()
        return left + self._killed


# ---------------------------------------------------------------------------------------------
# The process's side
# ---------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """Dies with the parent (`PR_SET_PDEATHSIG`) and adopts the function's orphans (`PR_SET_CHILD_SUBREAPER`)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass  # not Linux: the socket's EOF still ends an idle process
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(0)


def _end_leftovers(sock: socket.socket, pid: int) -> None:
    """At the process's exit, after the function's module's own exit handlers (registered later, run earlier):
    kills the processes the function left running and tells the parent how many (`FunctionProcess.close`). Not in
    a process the function forked (`pid` is the function's process), which inherits the exit handlers."""
    if os.getpid() != pid:
        return
    count = kill_descendants(pid)
    try:
        send_message(sock, ("leftovers", count))
    except OSError:
        pass


def serve(fd: int, parent_pid: int, spec: str) -> None:
    """The function's process (started by `FunctionProcess` with `_BOOTSTRAP`): loads `spec`, then answers calls
    on the socket `fd` until EOF."""
    _die_with_parent(parent_pid)
    sock = socket.socket(fileno=fd)
    atexit.register(_end_leftovers, sock, os.getpid())  # before the module's own exit handlers: runs after them

    try:
        function = load_reward_function(spec)
    except RewardFunctionError as error:
        send_message(sock, ("load_error", str(error)))
        return
    except BaseException as error:  # noqa: BLE001  SystemExit, KeyboardInterrupt from the module's code
        send_message(sock, ("load_error", f"reward function {spec!r}: loading it raised {type(error).__name__}"))
        return
    send_message(sock, ("ready", os.getpid()))
    while True:
        try:
            kwargs = recv_message(sock, None)
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", function(**kwargs))
        except BaseException as error:  # noqa: BLE001  the user's exception (SystemExit too): reported, not fatal
            traceback.print_exc()
            sys.stderr.flush()
            reply = ("raised", _truncated(f"{type(error).__name__}: {error}", 300))
        try:
            send_message(sock, reply)
        except OSError:
            return
        except Exception as error:  # noqa: BLE001  pickling the result failed before anything was sent
            result = reply[1]
            send_message(
                sock, ("unpicklable", f"a {type(result).__name__} ({_short(result)}), which cannot be pickled")
            )
            del error
