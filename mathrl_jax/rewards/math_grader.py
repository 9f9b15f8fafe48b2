"""Rule-based math answer grading: the last `\\boxed{}` answer, checked against the gold with math-verify.

    reward = values.correct    if verify(parse(gold), parse(answer))   (gold first, math-verify's order)
             values.incorrect  if the answer differs, or its grading timed out or crashed
             values.no_answer  if the response has no answer at all
           + values.format_reward  if the response has a non-empty \\boxed{} answer

The answer is the content of the **last** `\\boxed{...}` / `\\fbox{...}` (braces matched,
as verl's `last_boxed_only_string`), else the text after the last "answer is" /
"Answer:" (Minerva's "Final Answer: The final answer is X. I hope it is correct.",
Math-Shepherd's "The answer is: X") or GSM8K's "#### X" on the rest of its line.

Timeouts. math-verify's own timeout is `signal.alarm`, which works only in the
main thread. Here math-verify runs with it disabled (`parse(..., parsing_timeout=None)`,
`verify(..., timeout_seconds=None)`) in persistent worker processes, and the
caller waits for the answer on a socket with a deadline: a worker that runs past
`timeout_s`, crashes or dies is killed and replaced. Nothing depends on signals
or on being the main thread, and it works inside daemonic processes (such as
`multiprocessing.Pool` workers, which may not have `multiprocessing` children):
the workers are forked by a small "zygote" process started with `subprocess`,
which imports math-verify once, so a replacement worker is ready in milliseconds
instead of the second an interpreter start takes. The workers run under a memory
limit (`RLIMIT_AS`), so an answer like `10^{10^{10}}` cannot take the machine's
memory either. The grading code is POSIX-only (fork, Unix sockets).

A timeout or a crash of the grader is never raised: it is the status "timeout" /
"error" (worth `values.incorrect`) and is counted in the metrics. Only misuse
raises: a response or gold that is not a string, an empty gold, a bad timeout (and a
RuntimeError if the worker processes cannot start at all, e.g. math-verify is missing).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import os
import pickle
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

STATUSES = ("correct", "incorrect", "no_answer", "timeout", "error")
"""Every `GradeResult.status`."""

DEFAULT_MEMORY_LIMIT_BYTES = 4 * 1024**3
"""Address-space limit of a grading worker (`RLIMIT_AS`); past it the grading fails with MemoryError ("error")."""

DEFAULT_STARTUP_TIMEOUT_S = 120.0
"""How long to wait for the worker processes to import math-verify (not counted in `timeout_s`)."""


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """The verdict on one response.

    Attributes:
      status: "correct" | "incorrect" | "no_answer" | "timeout" | "error".
      extracted: the extracted answer string, None when none was found.
      formatted: the response has the required format, a non-empty `\\boxed{}` answer.
      detail: why the status is "error" or "timeout" (for logs), else None.
    """

    status: str
    extracted: str | None
    formatted: bool
    detail: str | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown grade status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def correct(self) -> bool:
        return self.status == "correct"


@dataclasses.dataclass(frozen=True)
class RewardValues:
    """Reward of each outcome: 1 / 0 / 0 by default; RLinf's math reward is correct=5, incorrect=no_answer=-5.

    `format_reward` is added to the outcome's value when the response has a `\\boxed{}` answer.
    A "timeout" or "error" is worth `incorrect`.
    """

    correct: float = 1.0
    incorrect: float = 0.0
    no_answer: float = 0.0
    format_reward: float = 0.0


def reward_value(result: GradeResult, values: RewardValues) -> float:
    """values.{correct, no_answer, incorrect}[outcome] + values.format_reward * result.formatted."""
    if result.status == "correct":
        base = values.correct
    elif result.status == "no_answer":
        base = values.no_answer
    else:  # incorrect, timeout, error
        base = values.incorrect
    return float(base) + (float(values.format_reward) if result.formatted else 0.0)


# ---------------------------------------------------------------------------
# Answer extraction (in the calling process: linear-time string scans)
# ---------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# A backslash escape (`\{`, `\}`, `\\`) or a grouping brace.
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)
_SPACED_ARGUMENT = re.compile(r"[ \t]+([^\s$]*)")
_FALLBACK_ANCHORS = re.compile(r"\banswer(?:\s+is\b[ \t]*:?|[ \t]*:)|^####", re.IGNORECASE | re.MULTILINE)
_MINERVA_TAIL = re.compile(r"\.?\s*I hope it is correct.*$", re.IGNORECASE)


def _require_str(value, name: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.80}")


def _braced_group(text: str, open_index: int) -> str | None:
    """Content of the brace group opening at `text[open_index] == "{"`, None if it never closes.

    Escaped braces (`\\{`, `\\}`) do not count, as in LaTeX.
    """
    depth = 0
    for match in _BRACE_TOKENS.finditer(text, open_index):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : match.start()]
    return None


def _last_box(text: str) -> tuple[bool, str | None]:
    """(whether `text` has a box command, the content of the last one or None if it is unfinished)."""
    end = len(text)
    while True:
        start, command = -1, ""
        for candidate in _BOX_COMMANDS:
            i = text.rfind(candidate, 0, end)
            if i > start:
                start, command = i, candidate
        if start < 0:
            return False, None
        i = start + len(command)
        following = text[i] if i < len(text) else ""
        if following.isalpha():  # e.g. "\boxedwidth": another command, keep looking left
            end = start
            continue
        if following == "{":
            return True, _braced_group(text, i)
        if following in (" ", "\t"):
            match = _SPACED_ARGUMENT.match(text, i)
            j = match.end()
            if match.group(1) == "" and j < len(text) and text[j] == "{":
                return True, _braced_group(text, j)
            if match.group(1).startswith("{"):
                return True, _braced_group(text, match.start(1))
            return True, match.group(1).rstrip(".,;") or None
        return True, None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}` in `text`, braces matched (so nested groups stay whole).

    Also `\\boxed 5` (no braces: up to the next whitespace or `$`, less a trailing
    period or comma) and `\\boxed {5}`. None when there is no box, or when the last
    one is unfinished (`...\\boxed{\\frac{1}{2` at the end of a truncated response):
    the last answer the response started is the one that counts, as in verl.
    Returns the raw content (possibly "" for `\\boxed{}`).
    """
    _require_str(text, "text")
    return _last_box(text)[1]


def _clean_answer(answer: str) -> str:
    """Strips whitespace, a trailing period, and math delimiters around the whole answer."""
    answer = answer.strip()
    for _ in range(3):
        before = answer
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1].rstrip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(answer) >= len(left) + len(right) and answer.startswith(left) and answer.endswith(right):
                answer = answer[len(left) : len(answer) - len(right)].strip()
        if answer == before:
            break
    return answer


def _fallback_answer(response: str) -> str | None:
    """The rest of the line after the last "answer is" / "answer:" / "####" anchor."""
    last = None
    for last in _FALLBACK_ANCHORS.finditer(response):
        pass
    if last is None:
        return None
    line_end = response.find("\n", last.end())
    rest = response[last.end() : line_end if line_end >= 0 else len(response)]
    rest = _MINERVA_TAIL.sub("", rest)
    answer = _clean_answer(rest)
    return answer or None


def extract_answer(response: str) -> str | None:
    """The response's final answer: the last box (`extract_boxed`), else the fallbacks; None if none.

    A response with a box is judged by its last box alone: an empty (`\\boxed{}`) or
    unfinished last box is no answer. The fallbacks are for responses with no box at
    all: the rest of the line after the last "answer is" (any case: "the final answer
    is", "The answer is: ") or "Answer:" (Minerva), or after GSM8K's "####" at the
    start of a line; Minerva's ". I hope it is correct." and `$...$` around the
    answer are removed.
    """
    _require_str(response, "response")
    has_box, boxed = _last_box(response)
    if has_box:
        return (boxed.strip() or None) if boxed is not None else None
    return _fallback_answer(response)


def _gold_answer(gold: str) -> str:
    """The gold answer to grade against: the content of its last box if it has one (a full solution), else itself."""
    _require_str(gold, "gold")
    answer = gold
    if any(command in gold for command in _BOX_COMMANDS):
        boxed = extract_boxed(gold)
        if boxed is not None and boxed.strip():
            answer = boxed
    answer = _clean_answer(answer)
    if not answer:
        raise ValueError(f"gold answer {gold!r} is empty; every sample needs a reference answer")
    return answer


def _check_timeout(timeout_s) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


# ---------------------------------------------------------------------------
# The verification itself (runs in a worker process)
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


class _WorkerPool:
    """Grading workers forked on demand from one zygote; one worker per concurrent request."""

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


def _grade_with(pool: _WorkerPool, response: str, gold_answer: str, timeout_s: float) -> GradeResult:
    _require_str(response, "response")
    boxed = extract_boxed(response)
    formatted = boxed is not None and bool(boxed.strip())
    answer = extract_answer(response)
    if answer is None:
        return GradeResult("no_answer", None, formatted)
    status, detail = pool.run(gold_answer, _clean_answer(answer), timeout_s)
    return GradeResult(status, answer, formatted, detail)


_DEFAULT_POOL: _WorkerPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def _default_pool() -> _WorkerPool:
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = _WorkerPool(DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_STARTUP_TIMEOUT_S)
        return _DEFAULT_POOL


def shutdown_workers() -> None:
    """Stops the worker processes that `grade` started (they are restarted on the next call; also run at exit)."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        pool, _DEFAULT_POOL = _DEFAULT_POOL, None
    if pool is not None:
        pool.close()


def _forget_default_pool_in_child() -> None:
    global _DEFAULT_POOL, _DEFAULT_POOL_LOCK
    _DEFAULT_POOL, _DEFAULT_POOL_LOCK = None, threading.Lock()


atexit.register(shutdown_workers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_pool_in_child)


def grade(response: str, gold: str, *, timeout_s: float = 5.0) -> GradeResult:
    """Grades one response against the gold answer; never raises for bad model output.

    Args:
      response: the model's full response text.
      gold: the reference answer ("\\frac{1}{2}", "[1, 2)") or a solution with a `\\boxed{}` answer.
      timeout_s: wall-clock limit on grading this answer in a worker process. Past it the
        worker is killed and the status is "timeout". The first call in a process also
        waits for the workers to start (about a second, not counted).

    Returns:
      GradeResult: "correct" / "incorrect" (math-verify's verdict, gold parsed first),
      "no_answer" (nothing extracted, see `extract_answer`), "timeout", or "error"
      (math-verify crashed on this answer, or the worker died).

    Raises:
      TypeError / ValueError for a non-string response or gold, an empty gold, or a
      non-positive timeout: mistakes of the caller, not of the model.
    """
    timeout_s = _check_timeout(timeout_s)
    gold_answer = _gold_answer(gold)
    return _grade_with(_default_pool(), response, gold_answer, timeout_s)


class MathGrader:
    """Grades batches of responses in parallel worker processes, in order; see the module docstring.

        with MathGrader(RewardValues(correct=5.0, incorrect=-5.0, no_answer=-5.0), num_workers=4) as grader:
            rewards, metrics = grader.rewards(responses, golds)

    Each response gets `timeout_s` seconds of grading; a timed-out or crashed worker is
    killed and replaced and the response counts as incorrect (status "timeout" /
    "error"), reported in the metrics. `close()` (or leaving the `with` block) stops
    the worker processes.
    """

    def __init__(
        self,
        values: RewardValues = RewardValues(),
        *,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ):
        if not isinstance(values, RewardValues):
            raise TypeError(f"values must be a RewardValues, got {type(values).__name__}: {values!r:.80}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if memory_limit_bytes is not None and (not isinstance(memory_limit_bytes, int) or memory_limit_bytes < 0):
            raise ValueError(f"memory_limit_bytes must be a non-negative int or None, got {memory_limit_bytes!r}")
        self.values = values
        self.timeout_s = _check_timeout(timeout_s)
        self.num_workers = num_workers
        self._pool = _WorkerPool(memory_limit_bytes, _check_timeout(startup_timeout_s))
        self._pool.start()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            num_workers, thread_name_prefix="math-grader"
        )

    def grade_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[GradeResult]:
        """`grade` of every (response, gold) pair, `num_workers` at a time; results in input order."""
        if self._executor is None:
            raise RuntimeError("MathGrader.grade_batch called after close()")
        if isinstance(responses, str) or isinstance(golds, str):
            raise TypeError("responses and golds must be sequences of strings, not a single string")
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} gold answers")
        for i, response in enumerate(responses):
            _require_str(response, f"responses[{i}]")
        gold_answers = []
        for i, gold in enumerate(golds):
            try:
                gold_answers.append(_gold_answer(gold))
            except (TypeError, ValueError) as e:
                raise type(e)(f"golds[{i}]: {e}") from None
        futures = [
            self._executor.submit(_grade_with, self._pool, response, gold, self.timeout_s)
            for response, gold in zip(responses, gold_answers)
        ]
        return [future.result() for future in futures]

    def rewards(self, responses: Sequence[str], golds: Sequence[str]) -> tuple[np.ndarray, dict[str, float]]:
        """(`[N]` float32 rewards, metrics) of a batch.

        Metrics: "reward/mean", "reward/accuracy" (fraction correct), "reward/no_answer_rate",
        "reward/format_rate" (fraction with a boxed answer), "reward/timeout_count",
        "reward/error_count".
        """
        results = self.grade_batch(responses, golds)
        rewards = np.asarray([reward_value(r, self.values) for r in results], np.float32)
        return rewards, grade_metrics(results, rewards)

    def close(self) -> None:
        """Stops the worker threads and processes; idempotent."""
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None:
            executor.shutdown(wait=True)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()

    def __enter__(self) -> MathGrader:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  best effort at garbage collection
            pass


def grade_metrics(results: Sequence[GradeResult], rewards: np.ndarray | None = None) -> dict[str, float]:
    """Batch metrics of grade results (see `MathGrader.rewards`); fractions are 0 for an empty batch."""
    n = max(len(results), 1)
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    metrics = {
        "reward/accuracy": counts["correct"] / n,
        "reward/no_answer_rate": counts["no_answer"] / n,
        "reward/format_rate": sum(r.formatted for r in results) / n,
        "reward/timeout_count": float(counts["timeout"]),
        "reward/error_count": float(counts["error"]),
    }
    if rewards is not None:
        metrics["reward/mean"] = float(np.mean(rewards)) if len(results) else 0.0
    return metrics


if __name__ == "__main__" and sys.argv[1:2] == ["--zygote"]:
    _zygote_main(int(sys.argv[2]), int(sys.argv[3]))
