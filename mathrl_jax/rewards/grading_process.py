"""What runs in the grading processes: math-verify on one (gold, answer) pair, the zygote and the workers it forks.

The zygote runs this file as a script (`python .../grading_process.py --zygote FD LIMIT`),
so the module imports only the standard library (math-verify lazily): it must run
without `mathrl_jax` on the path and without loading the grader, numpy or JAX.
The parent's side (`worker_pool`) shares its message framing.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import sys
import time

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


def send_message(sock: socket.socket, obj) -> None:
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


def recv_message(sock: socket.socket, deadline: float | None):
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
            gold, answer = recv_message(sock, None)
        except (EOFError, OSError):
            return
        try:
            reply = _verify_answer(gold, answer, gold_cache, configs)
        except BaseException as e:  # noqa: BLE001  MemoryError, RecursionError, parser crashes: this answer's "error"
            reply = ("error", f"math-verify raised {type(e).__name__}")
        try:
            send_message(sock, reply)
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


if __name__ == "__main__" and sys.argv[1:2] == ["--zygote"]:
    _zygote_main(int(sys.argv[2]), int(sys.argv[3]))
