"""Grading workers: math-verify in persistent, killable processes, with a deadline on every answer.

math-verify's own timeout is `signal.alarm`, which works only in the main thread. Here
math-verify runs with it disabled (`parse(..., parsing_timeout=None)`,
`verify(..., timeout_seconds=None)`) in persistent worker processes, and the caller
waits for the answer on a socket with a deadline: a worker that runs past `timeout_s`,
crashes or dies is killed and replaced. Nothing depends on signals or on being the
main thread, and it works inside daemonic processes (such as `multiprocessing.Pool`
workers, which may not have `multiprocessing` children): the workers are forked by a
small "zygote" process started with `subprocess`, which imports math-verify once, so a
replacement worker is ready in milliseconds instead of the second an interpreter start
takes. The workers run under a memory limit (`RLIMIT_AS`), so an answer like
`10^{10^{10}}` cannot take the machine's memory either. POSIX-only (fork, Unix sockets).

This module is the parent's side; what runs in the zygote and its workers is `grading_process`.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time

from mathrl_jax.rewards import grading_process

DEFAULT_MEMORY_LIMIT_BYTES = 4 * 1024**3
"""Address-space limit of a grading worker (`RLIMIT_AS`); past it the grading fails with MemoryError ("error")."""

DEFAULT_STARTUP_TIMEOUT_S = 120.0
"""How long to wait for the worker processes to import math-verify (not counted in `timeout_s`)."""


class _Zygote:
    """Parent-side handle of the zygote process (started with `subprocess`, so it works in daemonic processes)."""

    def __init__(self, memory_limit_bytes: int):
        self.ctrl, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(grading_process.__file__),
                    "--zygote",
                    str(child_end.fileno()),
                    str(memory_limit_bytes),
                ],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            child_end.close()
        self.lock = threading.Lock()
        self.ready = False

    def _recv(self, timeout: float):
        self.ctrl.settimeout(timeout)
        try:
            data = self.ctrl.recv(4096)
        except TimeoutError:
            raise RuntimeError(f"the math-verify worker process did not answer within {timeout:.0f} s") from None
        except OSError:
            data = b""
        if not data:
            code = self.process.poll()
            raise RuntimeError(
                f"the math-verify worker process exited (code {code}); its error, if any, is on stderr above. "
                f"Is math-verify installed for {sys.executable}?"
            )
        return pickle.loads(data)

    def _wait_ready(self, startup_timeout_s: float) -> None:
        if not self.ready:
            op, _ = self._recv(startup_timeout_s)
            assert op == "ready", op
            self.ready = True

    def fork(self, startup_timeout_s: float) -> _Worker:
        with self.lock:
            self._wait_ready(startup_timeout_s)
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(self.ctrl, [pickle.dumps(("fork", None))], [child_end.fileno()])
            except OSError as e:
                parent_end.close()
                raise RuntimeError(f"the math-verify worker process is gone ({e})") from None
            finally:
                child_end.close()
            op, pid = self._recv(60.0)
            assert op == "forked", op
        return _Worker(parent_end, pid, self)

    def kill(self, pid: int) -> None:
        with self.lock:
            try:
                self.ctrl.send(pickle.dumps(("kill", pid)))
                self._recv(60.0)
            except (OSError, RuntimeError):
                pass  # the zygote is gone, and its workers with it

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if not self.ready:  # still importing math-verify, no workers yet: no need to wait for it
            self.process.kill()
        try:
            self.ctrl.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Worker:
    def __init__(self, sock: socket.socket, pid: int, zygote: _Zygote):
        self.sock, self.pid, self.zygote = sock, pid, zygote

    def request(self, gold: str, answer: str, timeout_s: float) -> tuple[str, str | None, bool]:
        """(status, detail, still usable). Raises BrokenPipeError if the worker was already dead."""
        deadline = time.monotonic() + timeout_s
        try:
            self.sock.settimeout(timeout_s)
            grading_process.send_message(self.sock, (gold, answer))
        except TimeoutError:
            return "timeout", f"sending the answer took more than {timeout_s:g} s", False
        try:
            status, detail = grading_process.recv_message(self.sock, deadline)
        except TimeoutError:
            return "timeout", f"grading took more than {timeout_s:g} s", False
        except (EOFError, OSError):
            return "error", "the grading worker died (crash or out of memory)", False
        return status, detail, True

    def retire(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.zygote.alive():
                self.zygote.kill(self.pid)


class WorkerPool:
    """Grading workers forked on demand from one zygote; one worker per concurrent request.

        pool = WorkerPool(DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_STARTUP_TIMEOUT_S)
        status, detail = pool.run(gold, answer, timeout_s)  # "correct" | "incorrect" | "timeout" | "error"
        pool.close()

    Thread-safe; a pool inherited through fork starts afresh in the child process.
    """

    def __init__(self, memory_limit_bytes: int | None, startup_timeout_s: float):
        self.memory_limit_bytes = int(memory_limit_bytes or 0)
        self.startup_timeout_s = startup_timeout_s
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._zygote: _Zygote | None = None
        self._pid = os.getpid()
        self._closed = False

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # inherited through fork: the parent's workers are not ours to use
            self._reset()

    def _current_zygote(self) -> _Zygote:
        """The live zygote, started (again) if needed. Called with the lock held."""
        if self._closed:
            raise RuntimeError("this grader has been closed")
        if self._zygote is None or not self._zygote.alive():
            if self._zygote is not None:
                for worker in self._idle:
                    worker.sock.close()
                self._idle.clear()
                self._zygote.close()
            self._zygote = _Zygote(self.memory_limit_bytes)
        return self._zygote

    def start(self) -> None:
        """Starts the zygote now, so that its import of math-verify overlaps the caller's work."""
        self._check_process()
        with self._lock:
            self._current_zygote()

    def _acquire(self) -> _Worker:
        with self._lock:
            zygote = self._current_zygote()  # a dead zygote is replaced, and its idle workers let go
            if self._idle:
                return self._idle.pop()
        return zygote.fork(self.startup_timeout_s)

    def run(self, gold: str, answer: str, timeout_s: float) -> tuple[str, str | None]:
        """(status, detail) of grading `answer` against `gold` within `timeout_s` seconds."""
        self._check_process()
        for attempt in range(2):
            try:
                worker = self._acquire()
            except RuntimeError:
                if attempt == 0 and not self._closed:
                    continue  # the zygote died under us; the next _acquire starts a new one
                raise
            try:
                status, detail, usable = worker.request(gold, answer, timeout_s)
            except (BrokenPipeError, ConnectionResetError):
                # Dead before the request reached it (killed from outside while idle): not this answer's fault.
                worker.retire()
                if attempt == 0:
                    continue
                return "error", "the grading worker could not be reached"
            if usable:
                with self._lock:
                    if not self._closed and worker.zygote is self._zygote:
                        self._idle.append(worker)
                        worker = None
            if worker is not None:
                worker.retire()
            return status, detail
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._pid != os.getpid():
            self._reset()
            self._closed = True
            return
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            zygote, self._zygote = self._zygote, None
        for worker in idle:
            worker.sock.close()
        if zygote is not None:
            zygote.close()  # the zygote kills and reaps every worker it forked
