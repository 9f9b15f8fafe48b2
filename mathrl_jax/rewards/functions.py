"""Reward functions of the user's own, named in the config (`reward.functions`, as verl's `custom_reward_function`
names a file and a function) or passed in Python (`loop.train(config, reward_functions=[...])`, as TRL's
`reward_funcs`).

Each is called as TRL calls its reward functions:

    fn(prompts=[str], completions=[str], completion_ids=[[int]], trainer_state=TrainerState(...),
       question=[...], answer=[...], solution=[...], ground_truth=[...], worked_solution=[...], level=[...],
       subject=[...], uid=[...]) -> list of floats

one entry per completion (a prompt repeated once per sample of its group), the problem's fields as keyword lists
(`PROBLEM_COLUMNS`; a data file's other columns are not passed); a function takes the ones it needs and `**kwargs`
for the rest. Where the data's prompt is chat messages, `prompts` are those messages and each completion is
`[{"role": "assistant", "content": text}]`, TRL's conversational shape (`conversational`). `completion_ids` are each
completion's token ids (its EOS included, as TRL's), `trainer_state` says where the run is (`TrainerState`:
`global_step`, `epoch`, `max_steps`, as transformers' `TrainerState`), both as TRL passes them. The gold final
answer arrives as `answer`, as `solution` (what open-r1's and TRL's `accuracy_reward` parse with math-verify) and
as `ground_truth` (verl's name); the dataset's worked solution, where it has one, as `worked_solution`.

A `None` entry means "not scored by this function" (TRL's convention): it adds 0 and is left out of the function's
logged mean. The reward of a completion is the weighted sum over the functions (`reward.weights`, TRL's
`reward_weights`; default 1 each), plus the math verifier's score where `reward_source` is "verifier+functions".

Every result is checked (`check_result`): a list or tuple of one entry per completion, each a real number (a
bool counts as 1 or 0; numpy scalars too) or None, or a numeric array of shape `(n,)` (numpy, or anything with
`__array__`), every value finite in float32, the trainer's dtype (`1e39` is not). Anything else (a dict, a
string, a generator, a string entry, NaN, a wrong length) raises `RewardFunctionError` naming the function and
the value (exit status 2 from `scripts/train.py`); so do a function that raises and a weighted sum that
overflows float32.

Every call is bounded by `timeout_s` (`reward.function_timeout_s`); past it `RewardFunctionError` names the
function. How a call is bounded depends on how the function was given:

- named in the config (`RewardFunctions.from_config`, `reward.functions`): the function runs in a process of its
  own (`function_process.FunctionProcess`), loaded there from its module or file, and a call past the limit
  kills that process and its children (the next call starts a fresh one). This bounds any hang, one in C code
  holding the interpreter lock included (a regular expression that backtracks without end). The price: the
  function shares no state with the training process, and its arguments and result cross a socket pickled.
  No process the function starts outlives it: `close()` (and the program's exit) kills those still running,
  daemons in sessions of their own included, and says how many on stderr ("killed 2 processes left by reward
  functions"); a daemon holding the program's stdout no longer keeps `train.py | cat` waiting.
- given in Python (`RewardFunctions([fn, ...])`, `loop.train(reward_functions=...)`): a closure may hold
  anything, so it is called in this process, in a daemon thread that the caller waits for with a deadline. A
  thread cannot be stopped: past the limit the call is abandoned and keeps running in the background (the run
  stops; in Python a later call of that function is refused while it still runs), and a hang in C code that
  holds the interpreter lock stalls the whole process, the deadline included. Name the function in
  `reward.functions` to have it killed instead. (In a thread, signal-based timeouts, such as math-verify's
  default, do not work.) The processes such a function starts are the calling program's own, left to it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import reprlib
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from mathrl_jax.rewards.function_loading import RewardFunctionError, load_reward_function, split_spec
from mathrl_jax.rewards.function_process import FunctionProcess, FunctionProcessError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LOAD_TIMEOUT_S",
    "PROBLEM_COLUMNS",
    "RewardFunctionError",
    "RewardFunctions",
    "TrainerState",
    "check_result",
    "conversational",
    "load_reward_function",
    "parse_weights",
    "problem_columns",
    "split_spec",
]

PROBLEM_COLUMNS = ("question", "answer", "solution", "ground_truth", "worked_solution", "level", "subject", "uid")
"""The problem's columns each function receives, as lists aligned with the completions (`problem_columns`)."""

_COLUMN_FIELDS = {"solution": "answer", "ground_truth": "answer", "worked_solution": "solution"}
"""The `data.layouts.Problem` field behind each column not named as one: the gold answer is `solution` too."""


def problem_columns(problems: Sequence[Any]) -> Dict[str, list]:
    """`{column: [value per problem]}` of `PROBLEM_COLUMNS`: `answer`, `solution` and `ground_truth` the gold final
    answer (`Problem.answer`), `worked_solution` the dataset's worked solution (`Problem.solution`, or None)."""
    return {c: [getattr(p, _COLUMN_FIELDS.get(c, c)) for p in problems] for c in PROBLEM_COLUMNS}


def conversational(prompts: Sequence[Any], completions: Sequence[str], problems: Sequence[Any]) -> tuple:
    """(prompts, completions) as TRL gives them to its reward functions: for a problem whose prompt is chat
    messages (`Problem.messages`), its messages and `[{"role": "assistant", "content": completion}]` (what TRL's
    `accuracy_reward` reads as `completion[0]["content"]`); else the prompt text and the completion text."""
    chat = [getattr(p, "messages", None) for p in problems]
    if not any(chat):
        return list(prompts), list(completions)
    prompts = [[dict(m) for m in messages] if messages else text for messages, text in zip(chat, prompts)]
    completions = [
        [{"role": "assistant", "content": text}] if messages else text for messages, text in zip(chat, completions)
    ]
    return prompts, completions


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """Where the run is when a batch is scored, as the fields of transformers' `TrainerState` that TRL's reward
    functions read, counted in this run's iterations (TRL counts optimizer steps; an iteration here is
    num_mini_batch x ppo_epoch of them): `global_step` the iterations whose rollouts were collected before this
    batch's (0 at the first; an asynchronous run's generator runs ahead of the updates), `max_steps` the run's
    iterations, `epoch` the passes over the training problems done so far (fractional)."""

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = 0


DEFAULT_TIMEOUT_S = 60.0
"""The longest one call may take, in Python; a run takes `reward.function_timeout_s`."""

LOAD_TIMEOUT_S = 300.0
"""How long a function named in the config may take to load in its process (its module's imports), not counted
in the calls' timeout."""

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def parse_weights(text: str, count: int) -> Tuple[float, ...]:
    """`reward.weights` ("1.0,0.5"; "" = 1 each) for `count` functions."""
    if not str(text).strip():
        return (1.0,) * count
    try:
        weights = tuple(float(w) for w in str(text).split(","))
    except ValueError:
        raise RewardFunctionError(f"reward.weights={text!r}: expected comma-separated numbers") from None
    if len(weights) != count or not all(math.isfinite(w) for w in weights):
        raise RewardFunctionError(f"reward.weights={text!r}: expected {count} finite numbers, one per function")
    return weights


def _short(value) -> str:
    """A truncated repr of a function's result, for a message."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 6
    try:
        text = " ".join(short.repr(value).split())  # one line (numpy's repr of a matrix has several)
    except Exception:  # noqa: BLE001  a repr that fails: the type says enough
        return f"<{type(value).__name__}>"
    return text if len(text) <= 120 else text[:117] + "..."


def _a(value) -> str:
    """The article and the name of a value's type: "a dict", "an int"."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _entry(value):
    """A result entry as a float, None for None; raises TypeError for what is not a real number."""
    if value is None:
        return None
    if isinstance(value, (numbers.Real, np.bool_)):
        return float(value)  # OverflowError for an int beyond float64
    if hasattr(value, "__array__") and getattr(value, "shape", None) == ():  # a 0-d numpy / JAX array
        array = np.asarray(value)
        if array.dtype.kind in "biuf":
            return float(array)
    raise TypeError


def check_result(label: str, values: Any, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """`([n] float64 values, [n] bool scored)` of one function's result for `n` completions (None: 0, not scored),
    or RewardFunctionError naming `label` and the value: see the module's docstring for what is accepted."""
    expected = f"expected a list of {n} numbers (or None), one per completion"
    shown = _short(values)

    def refuse(what: str):
        raise RewardFunctionError(f"reward function {label!r} returned {what}")

    if isinstance(values, (str, bytes, bytearray, memoryview)) or not (
        isinstance(values, collections.abc.Sequence) or hasattr(values, "__array__")
    ):
        refuse(f"{_a(values)} ({shown}): {expected}")
    if not isinstance(values, collections.abc.Sequence):  # an array: numpy, JAX, torch
        try:
            array = np.asarray(values)
        except Exception as error:  # noqa: BLE001  an __array__ that fails
            refuse(f"{_a(values)} numpy cannot read ({type(error).__name__}): {expected}")
        if array.shape != (n,):
            refuse(f"an array of shape {array.shape} ({shown}) for {n} completions: expected shape ({n},)")
        if array.dtype.kind not in "biufO":
            refuse(f"an array of dtype {array.dtype} ({shown}): {expected}")
        values = array.tolist() if array.dtype.kind != "O" else list(array)  # Python numbers (numpy's for "O")
    if len(values) != n:
        refuse(f"{len(values)} values for {n} completions ({shown})")
    floats = np.zeros(n, np.float64)
    scored = np.zeros(n, bool)
    for i, value in enumerate(values):
        try:
            number = _entry(value)
        except TypeError:
            refuse(f"{shown}, whose entry {i} is {_a(value)} ({_short(value)}): {expected}")
        except OverflowError:
            number = math.inf
        if number is None:
            continue
        if not (math.isfinite(number) and abs(number) <= _FLOAT32_MAX):
            refuse(
                f"{shown}, whose entry {i} ({_short(value)}) is non-finite in float32, the trainer's dtype: "
                "expected finite numbers"
            )
        floats[i], scored[i] = number, True
    return floats, scored


class _InThread:
    """A Python callable, called in a daemon thread that the caller waits for until a deadline."""

    def __init__(self, function: Callable, label: str):
        self.function, self.label = function, label
        self._abandoned = None  # the thread of a call that ran past its deadline

    def __call__(self, kwargs: dict, timeout_s: float):
        if self._abandoned is not None and self._abandoned.is_alive():
            raise RewardFunctionError(
                f"reward function {self.label!r}: a call that ran past its time limit is still running (a thread "
                "cannot be stopped); name the function in reward.functions to run it in a process that can be killed"
            )
        outcome: Dict[str, Any] = {}

        def run():
            try:
                outcome["result"] = self.function(**kwargs)
            except BaseException as error:  # noqa: BLE001  handed to the caller
                outcome["error"] = error

        thread = threading.Thread(target=run, name=f"reward-function-{self.label}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            self._abandoned = thread
            raise RewardFunctionError(
                f"reward function {self.label!r} did not return within {timeout_s:g} s (reward.function_timeout_s); "
                "called in a thread, it cannot be stopped and keeps running"
            )
        if "error" in outcome:
            error = outcome["error"]
            raise RewardFunctionError(
                f"reward function {self.label!r} raised {type(error).__name__}: {str(error)[:300]}"
            ) from error
        return outcome["result"]

    def close(self) -> None:
        pass


class _InProcess:
    """A function named by its spec, in its own killable process (`function_process.FunctionProcess`)."""

    def __init__(self, spec: str):
        self.label = spec
        self.process = FunctionProcess(spec)

    def wait_ready(self) -> None:
        self._run(lambda: self.process.wait_ready(LOAD_TIMEOUT_S), "")

    def __call__(self, kwargs: dict, timeout_s: float):
        return self._run(lambda: self.process.call(kwargs, timeout_s, LOAD_TIMEOUT_S), " (reward.function_timeout_s)")

    def _run(self, step, setting: str):
        try:
            return step()
        except FunctionProcessError as error:
            if error.kind == "timeout":
                message = f"{error}{setting}; its process and the processes it started were killed"
            elif error.kind == "unpicklable":
                message = f"{error}: expected a list of numbers (or None), one per completion"
            else:
                message = str(error)
            raise RewardFunctionError(message) from None

    def close(self) -> int:
        return self.process.close()


def _close_all(callers) -> None:
    left = {}
    for caller in callers:
        try:
            count = caller.close()
        except Exception:  # noqa: BLE001  closing at exit: the processes die with this one anyway
            continue
        if count:
            left[caller.label] = left.get(caller.label, 0) + int(count)
    if left:
        total = sum(left.values())
        each = ", ".join(f"{label}: {count}" for label, count in left.items())
        try:
            print(
                f"killed {total} process{'es' if total != 1 else ''} left by reward functions ({each})",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):  # a closed stderr at the interpreter's exit
            pass


class RewardFunctions:
    """The weighted sum of reward functions: `(prompts, completions, problems) -> (scores [N], metrics)`, with each
    function's mean and std in the metrics (`rollout/function/<name>`, `rollout/function_std/<name>`). Each call's
    result is checked and each call is bounded by `timeout_s` (the module's docstring says how); `close()` ends the
    functions' processes."""

    def __init__(
        self,
        functions: Sequence[Callable],
        weights: Sequence[float],
        names: Sequence[str] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_steps: int = 0,
    ):
        if not functions:
            raise RewardFunctionError("no reward functions")
        if len(weights) != len(functions):
            raise RewardFunctionError(f"{len(weights)} weights for {len(functions)} reward functions")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
            raise RewardFunctionError(f"reward function timeout {timeout_s!r}: expected a finite number of seconds > 0")
        self.timeout_s = float(timeout_s)
        self.max_steps = int(max_steps)  # `TrainerState.max_steps`
        self.weights = tuple(float(w) for w in weights)
        names = list(names) or [getattr(f, "__name__", f"function_{i}") for i, f in enumerate(functions)]
        # Unique names for the metrics: a.py:score and b.py:score log as score and score_2.
        self.names = [n if names[:i].count(n) == 0 else f"{n}_{names[:i].count(n) + 1}" for i, n in enumerate(names)]
        self.callers = [
            f if isinstance(f, _InProcess) else _InThread(f, getattr(f, "__qualname__", name))
            for f, name in zip(functions, self.names)
        ]
        self._finalizer = weakref.finalize(self, _close_all, list(self.callers))

    @classmethod
    def from_config(
        cls, specs: str, weights: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_steps: int = 0
    ) -> "RewardFunctions":
        """The functions `reward.functions` names, each loaded in its own process (all started at once, then
        waited for: a function that does not load raises RewardFunctionError, its processes ended)."""
        names = [s.strip() for s in str(specs).split(",") if s.strip()]
        parsed = parse_weights(weights, len(names))
        for spec in names:  # the spec's form, checked here: no process for a malformed one
            split_spec(spec)
        callers = []
        try:
            for spec in names:
                callers.append(_InProcess(spec))
            for caller in callers:
                caller.wait_ready()
        except BaseException:
            _close_all(callers)
            raise
        return cls(callers, parsed, [s.rpartition(":")[2] for s in names], timeout_s, max_steps)

    def __call__(
        self,
        prompts: List[str],
        completions: List[str],
        problems: Sequence[Any],
        *,
        completion_ids: Sequence[Sequence[int]] = None,
        global_step: int = 0,
        epoch: float = 0.0,
    ):
        """Scores `completions` (`completion_ids`: their token ids; None passes None); `global_step` and `epoch`
        make the functions' `trainer_state` with this run's `max_steps`."""
        columns = problem_columns(problems)
        prompts, completions_arg = conversational(prompts, completions, problems)
        ids = None if completion_ids is None else [[int(t) for t in row] for row in completion_ids]
        state = TrainerState(global_step=int(global_step), epoch=float(epoch), max_steps=self.max_steps)
        total = np.zeros(len(completions), np.float64)
        metrics: Dict[str, float] = {}
        for caller, weight, name in zip(self.callers, self.weights, self.names):
            kwargs = dict(
                prompts=prompts, completions=completions_arg, completion_ids=ids, trainer_state=state, **columns
            )
            values, scored = check_result(caller.label, caller(kwargs, self.timeout_s), len(completions))
            total += weight * values
            if scored.any():  # TRL's rewards/{name}/mean and rewards/{name}/std, over the completions it scored
                metrics[f"rollout/function/{name}"] = float(values[scored].mean())
                metrics[f"rollout/function_std/{name}"] = float(values[scored].std())
        with np.errstate(over="ignore"):
            scores = total.astype(np.float32)
        if not np.all(np.isfinite(scores)):
            i = int(np.flatnonzero(~np.isfinite(scores))[0])
            raise RewardFunctionError(
                f"reward functions {', '.join(map(repr, self.names))}: their weighted sum (weights {self.weights}) "
                f"for completion {i} is {total[i]:g}, non-finite in float32, the trainer's dtype"
            )
        return scores, metrics

    def close(self) -> None:
        """Ends the processes of the functions named in the config (idempotent; also at garbage collection)."""
        self._finalizer()

    def __enter__(self) -> "RewardFunctions":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
