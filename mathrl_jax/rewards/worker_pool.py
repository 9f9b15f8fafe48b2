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

The zygote runs this file as a script (`python .../worker_pool.py --zygote FD LIMIT`),
so the module imports only the standard library (math-verify lazily): it must run
without `mathrl_jax` on the path and without loading the grader, numpy or JAX.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

DEFAULT_MEMORY_LIMIT_BYTES = 4 * 1024**3
"""Address-space limit of a grading worker (`RLIMIT_AS`); past it the grading fails with MemoryError ("error")."""

DEFAULT_STARTUP_TIMEOUT_S = 120.0
"""How long to wait for the worker processes to import math-verify (not counted in `timeout_s`)."""


# ---------------------------------------------------------------------------
# math-verify on one (gold, answer) pair (runs in a worker process)
# ---------------------------------------------------------------------------


def _math_verify_configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def _parse(text: str, configs):
    from math_verify import parse

    # Our own answer string, boxed, so math-verify's LaTeX normalisation (units, \text,
    # \dfrac, ...) applies; its signal-based timeout is off: the caller enforces ours.
    return parse("\\boxed{" + text + "}", extraction_config=configs, parsing_timeout=None, raise_on_error=True)


def _verify_answer(gold: str, answer: str, gold_cache: dict[str, list], configs) -> tuple[str, str | None]:
    """("correct" | "incorrect" | "error", detail) of math-verify on (gold, answer), gold first."""
    from math_verify import verify

    gold_parsed = gold_cache.get(gold)
    if gold_parsed is None:
        gold_parsed = _parse(gold, configs)
        if len(gold_cache) >= 4096:
            gold_cache.clear()
        gold_cache[gold] = gold_parsed
    if not gold_parsed:
        return "error", "math-verify found nothing to compare in the gold answer"
    answer_parsed = _parse(answer, configs)
    if not answer_parsed:
        return "incorrect", None
    failures = 0
    for g in gold_parsed:
        for a in answer_parsed:
            try:
                if verify(g, a, timeout_seconds=None, raise_on_error=True):
                    return "correct", None
            except Exception as e:  # noqa: BLE001  one comparison failing does not decide; all failing is an error
                failures += 1
                failure = type(e).__name__
    if failures == len(gold_parsed) * len(answer_parsed):
        return "error", f"math-verify comparison raised {failure}"
    return "incorrect", None


# ---------------------------------------------------------------------------
# Worker processes: framing, the zygote, the workers
# ---------------------------------------------------------------------------

_HEADER = struct.Struct("!Q")


def _send_message(sock: socket.socket, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    """Exactly n bytes; socket.timeout past `deadline` (time.monotonic), EOFError if the peer closed."""
    data = bytearray()
    while len(data) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            sock.settimeout(remaining)
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        data += chunk
    return bytes(data)


def _recv_message(sock: socket.socket, deadline: float | None):
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    return pickle.loads(_recv_exact(sock, size, deadline))


def _worker_main(sock: socket.socket, memory_limit_bytes: int) -> None:
    """A grading worker (forked by the zygote): (gold, answer) requests -> (status, detail) replies until EOF."""
    if memory_limit_bytes > 0:
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        except (ValueError, OSError):
            pass  # a lower hard limit is already in force
    sock.settimeout(None)
    configs = _math_verify_configs()
    gold_cache: dict[str, list] = {}
    while True:
        try:
            gold, answer = _recv_message(sock, None)
        except (EOFError, OSError):
            return
        try:
            reply = _verify_answer(gold, answer, gold_cache, configs)
        except BaseException as e:  # noqa: BLE001  MemoryError, RecursionError, parser crashes: this answer's "error"
            reply = ("error", f"math-verify raised {type(e).__name__}")
        try:
            _send_message(sock, reply)
        except OSError:
            return


def _zygote_main(ctrl_fd: int, memory_limit_bytes: int) -> None:
    """Imports math-verify once, then forks a grading worker per "fork" request and kills/reaps on "kill".

    Control messages (pickled, one per SOCK_SEQPACKET packet): ("fork", None) with the
    worker's socket attached as an fd -> ("forked", pid); ("kill", pid) -> ("killed", pid).
    The zygote reaps a worker only when told to kill it, so a pid the parent holds is
    never reused behind its back. EOF on the control socket (the parent closed the
    pool or died) kills every worker and exits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    ctrl = socket.socket(fileno=ctrl_fd)
    logging.disable(logging.WARNING)  # math-verify warns that its own timeout is off, once per process
    configs = _math_verify_configs()
    _verify_answer("\\frac{1}{2}", "0.5", {}, configs)  # warm the parser up before forking
    ctrl.send(pickle.dumps(("ready", os.getpid())))
    children = set()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctrl, 4096, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        op, arg = pickle.loads(data)
        if op == "fork":
            (fd,) = fds
            pid = os.fork()
            if pid == 0:
                try:
                    ctrl.close()
                    _worker_main(socket.socket(fileno=fd), memory_limit_bytes)
                finally:
                    os._exit(0)
            os.close(fd)
            children.add(pid)
            ctrl.send(pickle.dumps(("forked", pid)))
        elif op == "kill":
            if arg in children:
                try:
                    os.kill(arg, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(arg, 0)
                children.discard(arg)
            ctrl.send(pickle.dumps(("killed", arg)))
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


class _Zygote:
    """Parent-side handle of the zygote process (started with `subprocess`, so it works in daemonic processes)."""

    def __init__(self, memory_limit_bytes: int):
        self.ctrl, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
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
            _send_message(self.sock, (gold, answer))
        except TimeoutError:
            return "timeout", f"sending the answer took more than {timeout_s:g} s", False
        try:
            status, detail = _recv_message(self.sock, deadline)
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


if __name__ == "__main__" and sys.argv[1:2] == ["--zygote"]:
    _zygote_main(int(sys.argv[2]), int(sys.argv[3]))
