"""rewards.functions: TRL's reward-function convention, weighted; bad functions named, bad results refused, every
call bounded by a timeout (a thread for Python callables, a killable process for the functions a config names)."""

import os
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from mathrl_jax.rewards import functions as functions_module
from mathrl_jax.rewards.functions import (
    RewardFunctionError,
    RewardFunctions,
    conversational,
    load_reward_function,
    parse_weights,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBLEMS = [
    types.SimpleNamespace(question="1+1=", answer="2", solution=None, level=None, subject=None, uid=str(i))
    for i in range(3)
]


def lengths(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def only_the_first(prompts, completions, uid, **columns):
    return [1.0 if u == "0" else None for u in uid]  # None: not scored by this function (TRL)


def test_the_weighted_sum_and_each_functions_mean_over_what_it_scored():
    functions = RewardFunctions([lengths, only_the_first], [0.5, 2.0])
    scores, metrics = functions(["p"] * 3, ["a", "bb", "ccc"], PROBLEMS)
    np.testing.assert_allclose(scores, [0.5 * 1 + 2.0, 0.5 * 2, 0.5 * 3])
    # Each function's mean and (population) std over the completions it scored: lengths 1, 2, 3; the other scored one.
    assert metrics == {
        "rollout/function/lengths": 2.0,
        "rollout/function_std/lengths": pytest.approx(np.sqrt(((1 - 2) ** 2 + 0 + (3 - 2) ** 2) / 3)),
        "rollout/function/only_the_first": 1.0,
        "rollout/function_std/only_the_first": 0.0,
    }


def test_functions_of_the_same_name_log_apart():
    assert RewardFunctions([lengths, lengths], [1.0, 1.0]).names == ["lengths", "lengths_2"]


BAD_RESULTS = {
    # name: (the function's result for 3 completions, as Python source; what the message says)
    "dict": ("{0: 1.0, 1: 1.0, 2: 1.0}", "returned a dict ({0: 1.0, 1: 1.0, 2: 1.0})"),  # trained on its keys
    "str of digits": ("'111'", "returned a str ('111')"),  # trained on each character as 1.0
    "str": ("'abc'", "returned a str ('abc')"),
    "None": ("None", "returned a NoneType"),
    "one number": ("1.0", "returned a float"),
    "generator": ("(1.0 for _ in range(3))", "returned a generator"),
    "1e39": ("[1e39, 0.0, 0.0]", "entry 0 (1e+39) is non-finite in float32"),  # finite in float64: every update skipped
    "-1e39 in an array": ("numpy.array([0.0, 0.0, -1e39])", "entry 2 (-1e+39) is non-finite in float32"),
    "inf": ("[0.0, float('inf'), 0.0]", "entry 1 (inf) is non-finite"),
    "nan": ("[0.0, 0.0, float('nan')]", "entry 2 (nan) is non-finite"),
    "an int beyond float64": ("[10**400, 0, 0]", "entry 0 ("),
    "too few": ("[1.0]", "returned 1 values for 3 completions ([1.0])"),
    "too many": ("[1.0] * 4", "returned 4 values for 3 completions"),
    "an array too long": ("numpy.ones(4)", "an array of shape (4,)"),
    "an array of columns": ("numpy.ones((3, 1))", "an array of shape (3, 1)"),  # was flattened
    "nested lists": ("[[1.0], [1.0], [1.0]]", "entry 0 is a list ([1.0])"),  # was flattened
    "str entries": ("['1', '0', '1']", "entry 0 is a str ('1')"),  # was parsed as numbers
    "complex entries": ("[1j, 0.0, 0.0]", "entry 0 is a complex"),
    "an array of strings": ("numpy.array(['1', '0', '1'])", "an array of dtype <U1"),
}
"""Results that are not one number (or None) per completion, finite in float32: each raises, naming the function
and the value (issue 45: a dict trained on its keys, a string on its characters, 1e39 skipped every update)."""


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_a_bad_result_of_a_python_function_is_refused_naming_it_and_the_value(case):
    source, message = BAD_RESULTS[case]

    def bad(prompts, completions, **columns):
        return eval(source, {"numpy": np})

    with pytest.raises(RewardFunctionError) as raised:
        RewardFunctions([bad], [1.0])(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    assert "reward function " in str(raised.value) and ".bad'" in str(raised.value), raised.value
    assert message in str(raised.value), raised.value


def bad_results_module(tmp_path):
    """A file of one function per `BAD_RESULTS` case (named by its position) and some that misbehave otherwise."""
    lines = ["import os, re, subprocess, time", "import numpy", ""]
    for i, (source, _) in enumerate(BAD_RESULTS.values()):
        lines += [f"def bad_{i}(prompts, completions, **columns):", f"    return {source}", ""]
    path = tmp_path / "misbehaving.py"
    path.write_text("\n".join(lines) + MISBEHAVING)
    return path


MISBEHAVING = """
def good(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def spins(prompts, completions, **columns):
    while True:
        pass


def backtracks(prompts, completions, **columns):  # in C, holding the interpreter lock: no thread could stop it
    re.match(r"^(a+)+$", "a" * 60 + "b")
    return [0.0] * len(completions)


def hangs_once_with_a_child(prompts, completions, uid, **columns):
    mark = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.pid")
    if os.path.exists(mark):
        return [1.0] * len(completions)
    child = subprocess.Popen(["sleep", "300"])
    with open(mark, "w") as f:
        f.write(str(child.pid))
    time.sleep(300)


def raises(prompts, completions, **columns):
    raise ValueError("no good")


def exits(prompts, completions, **columns):
    os._exit(3)
"""


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_a_bad_result_of_a_function_named_in_the_config_is_refused_naming_it_and_the_value(case, tmp_path):
    path = bad_results_module(tmp_path)
    source, message = BAD_RESULTS[case]
    spec = f"{path}:bad_{list(BAD_RESULTS).index(case)}"
    with RewardFunctions.from_config(spec, "") as functions:
        with pytest.raises(RewardFunctionError) as raised:
            functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    assert f"reward function {spec!r} returned" in str(raised.value), raised.value
    if case != "generator":  # not picklable: named by its type alone
        assert message in str(raised.value), raised.value


def test_numbers_none_bools_numpy_scalars_and_arrays_are_accepted():
    """A list or tuple of numbers (a bool is 1 or 0, numpy scalars count) or None, or a numeric array of shape (n,)."""
    results = {
        "ints and None": ([1, None, 3], [1.0, 0.0, 3.0], 2.0),
        "bools": ([True, False, np.True_], [1.0, 0.0, 1.0], 2 / 3),
        "numpy scalars": ((np.float32(0.5), np.int64(2), np.float64(-1.0)), [0.5, 2.0, -1.0], 0.5),
        "0-d arrays": ([np.array(1.0), np.array(2), None], [1.0, 2.0, 0.0], 1.5),
        "float32 array": (np.array([0.25, 0.5, 0.75], np.float32), [0.25, 0.5, 0.75], 0.5),
        "bool array": (np.array([True, False, True]), [1.0, 0.0, 1.0], 2 / 3),
        "object array with None": (np.array([1.0, None, 2.0], dtype=object), [1.0, 0.0, 2.0], 1.5),
        "float32's largest": ([3.4e38, -3.4e38, 0.0], [3.4e38, -3.4e38, 0.0], 0.0),
    }
    for case, (returned, expected, mean) in results.items():
        functions = RewardFunctions([lambda prompts, completions, **kw: returned], [1.0], ["f"])
        scores, metrics = functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
        assert scores.dtype == np.float32 and np.all(np.isfinite(scores)), case
        np.testing.assert_allclose(scores, expected, rtol=1e-6, err_msg=case)
        assert metrics["rollout/function/f"] == pytest.approx(mean, rel=1e-6), case


def test_a_weighted_sum_beyond_float32_is_refused():
    large = lambda prompts, completions, **kw: [3e38] * len(completions)  # noqa: E731  finite alone, not summed
    with pytest.raises(RewardFunctionError, match="weighted sum .* non-finite in float32"):
        RewardFunctions([large, large], [1.0, 1.0])(["p"] * 3, ["a", "b", "c"], PROBLEMS)


def test_a_python_function_past_its_timeout_is_named_and_left_running_in_its_thread():
    """Called in a thread (a closure cannot move to another process): past `timeout_s` the call is abandoned,
    named; a later call is refused while the abandoned one still runs, and goes through once it has ended."""
    release = threading.Event()

    def waits(prompts, completions, **columns):
        if not release.is_set():
            release.wait(30)
        return [1.0] * len(completions)

    functions = RewardFunctions([waits], [1.0], timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(
        RewardFunctionError, match=r"'.*waits' did not return within 0.3 s \(reward.function_timeout_s\)"
    ):
        functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    assert time.monotonic() - start < 5
    with pytest.raises(RewardFunctionError, match="still running"):
        functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    release.set()
    abandoned = functions.callers[0]._abandoned
    abandoned.join(10)
    assert functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)[0].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("name", ["spins", "backtracks"])
def test_a_function_named_in_the_config_past_its_timeout_is_killed_and_named(name, tmp_path):
    """In its own process: a Python loop and a regular expression that backtracks in C (holding the interpreter
    lock, which no thread could stop) both end at the limit, named; the process is killed."""
    spec = f"{bad_results_module(tmp_path)}:{name}"
    functions = RewardFunctions.from_config(spec, "", timeout_s=1.0)
    pid = functions.callers[0].process.pid
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as raised:
        functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    assert time.monotonic() - start < 10
    assert f"reward function {spec!r} did not return within 1 s (reward.function_timeout_s)" in str(raised.value)
    assert not alive(pid)
    functions.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_kill_takes_the_functions_children_and_the_next_call_starts_afresh(tmp_path):
    path = bad_results_module(tmp_path)
    with RewardFunctions.from_config(f"{path}:hangs_once_with_a_child", "", timeout_s=1.0) as functions:
        with pytest.raises(RewardFunctionError, match="did not return within 1 s"):
            functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
        child = int((tmp_path / "child.pid").read_text())
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the function's child outlived the kill"
        assert functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)[0].tolist() == [1.0, 1.0, 1.0]  # a fresh process


def test_a_function_that_raises_or_exits_is_named(tmp_path):
    path = bad_results_module(tmp_path)
    for spec, message in [
        (f"{path}:raises", "raised ValueError: no good"),
        (f"{path}:exits", "its process exited during the call (code 3"),
    ]:
        with RewardFunctions.from_config(spec, "") as functions:
            with pytest.raises(RewardFunctionError) as raised:
                functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)
        assert f"reward function {spec!r}" in str(raised.value) and message in str(raised.value), raised.value

    def raises(prompts, completions, **columns):
        raise ValueError("no good")

    with pytest.raises(RewardFunctionError, match="raises' raised ValueError: no good") as raised:
        RewardFunctions([raises], [1.0])(["p"] * 3, ["a", "b", "c"], PROBLEMS)
    assert isinstance(raised.value.__cause__, ValueError)  # the traceback kept, for Python callers


def test_a_function_named_in_the_config_loads_in_its_process_or_is_named(tmp_path, monkeypatch):
    path = bad_results_module(tmp_path)
    with RewardFunctions.from_config(f"{path}:good", "") as functions:
        scores, metrics = functions(["p"] * 3, ["a", "bb", "ccc"], PROBLEMS)
        assert scores.tolist() == [1.0, 2.0, 3.0] and metrics["rollout/function/good"] == 2.0
        assert functions.callers[0].process.pid != os.getpid()
    slow = tmp_path / "slow_import.py"
    slow.write_text("import time\ntime.sleep(300)\n\ndef score(prompts, completions, **kw):\n    return []\n")
    monkeypatch.setattr(functions_module, "LOAD_TIMEOUT_S", 1.0)
    for spec, message in [
        (f"{tmp_path}/missing.py:score", "no file"),
        (f"{path}:nope", "has no function 'nope'"),
        (f"{slow}:score", "did not load within 1 s"),
    ]:
        with pytest.raises(RewardFunctionError, match=message):
            RewardFunctions.from_config(spec, "")


def test_a_functions_process_dies_with_the_program_that_started_it(tmp_path):
    """`PR_SET_PDEATHSIG`: a program killed while its function spins leaves no process behind."""
    spec = f"{bad_results_module(tmp_path)}:spins"
    program = f"""
import os, sys, threading, time, types
sys.path.insert(0, {ROOT!r})
from mathrl_jax.rewards.functions import RewardFunctions
functions = RewardFunctions.from_config({spec!r}, "", timeout_s=300)
problems = [types.SimpleNamespace(question="q", answer="a", solution=None, level=None, subject=None, uid="0")]
threading.Thread(target=functions, args=(["p"], ["c"], problems), daemon=True).start()
print(functions.callers[0].process.pid, flush=True)
time.sleep(0.5)
os._exit(0)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the function's process outlived its program"


def test_loading_by_module_and_by_file(tmp_path):
    assert load_reward_function("os.path:basename")("/a/b") == "b"
    path = tmp_path / "mine.py"
    path.write_text("def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    assert load_reward_function(f"{path}:score")(prompts=[], completions=["x"]) == [1.0]
    for spec, message in [
        ("no_colon", "expected 'module:function'"),
        (f"{tmp_path}/missing.py:score", "no file"),
        (f"{path}:nope", "has no function 'nope'"),
        ("no_such_module_xyz:f", "cannot load 'no_such_module_xyz'"),
    ]:
        with pytest.raises(RewardFunctionError, match=message):
            load_reward_function(spec)
    assert parse_weights("", 2) == (1.0, 1.0) and parse_weights("0.5, 2", 2) == (0.5, 2.0)
    with pytest.raises(RewardFunctionError, match="expected 2 finite numbers"):
        parse_weights("1", 2)


TRL_STYLE = """
def trl_style(prompts, completions, completion_ids, trainer_state, solution, worked_solution, **kwargs):
    return [
        float(len(ids) + 10 * trainer_state.global_step + 100 * trainer_state.max_steps + (s == "2") + (w is None))
        for ids, s, w in zip(completion_ids, solution, worked_solution)
    ]
"""


@pytest.mark.parametrize("where", ["python", "process"])
def test_trl_arguments_and_the_gold_answer_as_solution_reach_a_function(where, tmp_path):
    """TRL's `completion_ids` and `trainer_state` (global_step, max_steps) reach a function that declares them, in
    this process or pickled to its own; `solution` is the gold answer ("2"), the worked solution `worked_solution`
    (None here): each shows in the value the function returns, len(ids) + 10 step + 100 max_steps + 1 + 1."""
    if where == "python":
        namespace = {}
        exec(TRL_STYLE, namespace)
        functions = RewardFunctions([namespace["trl_style"]], [1.0], max_steps=4)
    else:
        module = tmp_path / "trl_style.py"
        module.write_text(TRL_STYLE)
        functions = RewardFunctions.from_config(f"{module}:trl_style", "", max_steps=4)
    ids = [[5, 6], [7], [8, 9, 3]]
    with functions:
        scores, _ = functions(["p"] * 3, ["a", "b", "c"], PROBLEMS, completion_ids=ids, global_step=2, epoch=0.5)
    np.testing.assert_array_equal(scores, [len(i) + 20 + 400 + 2 for i in ids])


TRL_ACCURACY = """
def accuracy(prompts, completions, solution, **kwargs):
    # TRL's accuracy_reward reads a conversational completion as completion[0]["content"]
    return [float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]


def system_prompt_seen(prompts, completions, **kwargs):
    return [float(p[0]["role"] == "system" and p[-1]["role"] == "user") for p in prompts]
"""


@pytest.mark.parametrize("where", ["python", "own process"])
def test_chat_message_problems_reach_functions_in_trls_conversational_shape(where, tmp_path):
    """Issue 48 (review): on chat-message data TRL passes each prompt as its messages and each completion as
    [{"role": "assistant", "content": ...}]; its accuracy_reward indexes them so. Text data keeps strings."""
    from mathrl_jax.data import Problem

    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="})
    chat = [Problem(uid=str(i), question="1+1=", answer="2", messages=messages) for i in range(3)]
    if where == "python":
        namespace = {}
        exec(TRL_ACCURACY, namespace)
        functions = RewardFunctions([namespace["accuracy"], namespace["system_prompt_seen"]], [1.0, 10.0])
    else:
        module = tmp_path / "trl_accuracy.py"
        module.write_text(TRL_ACCURACY)
        functions = RewardFunctions.from_config(f"{module}:accuracy,{module}:system_prompt_seen", "1,10")
    with functions:
        scores, _ = functions(["rendered"] * 3, ["2", " 2 ", "3"], chat)
    np.testing.assert_array_equal(scores, [11.0, 11.0, 10.0])
    prompts, completions = conversational(["text"], ["2"], [Problem(uid="t", question="q", answer="2")])
    assert (prompts, completions) == (["text"], ["2"])


DAEMONS = """
import os, subprocess


def starts_daemons(prompts, completions, **columns):
    mark = os.environ["MATHRL_TEST_DAEMON_MARK"]
    subprocess.Popen(["sleep", mark])  # in the function's process group
    subprocess.Popen(["sleep", mark], start_new_session=True)  # a session of its own
    pid = os.fork()
    if pid == 0:  # a daemon's double fork: a grandchild in a new session, its parent gone
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", mark])
        os._exit(0)
    os.waitpid(pid, 0)
    return [0.0] * len(completions)
"""


def sleeps(mark: str) -> list:
    """The living `sleep <mark>` processes of this machine."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", mark.encode()] and alive(int(name)):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def test_no_process_a_function_starts_outlives_its_process(tmp_path, monkeypatch, capfd):
    """Issue 60, point 6: a daemon a function started (its own session, a double fork) outlived the run and held
    its stdout (`train.py | cat` waited for it). Its process adopts the function's orphans, and closing it kills
    every process the function left, in any session, naming how many."""
    mark = f"{60 + os.getpid() % 1000 / 1000:.3f}"  # this test's sleeps, told apart from any other
    monkeypatch.setenv("MATHRL_TEST_DAEMON_MARK", mark)
    module = tmp_path / "daemons.py"
    module.write_text(DAEMONS)
    try:
        functions = RewardFunctions.from_config(f"{module}:starts_daemons", "")
        assert functions(["p"] * 3, ["a", "b", "c"], PROBLEMS)[0].tolist() == [0.0, 0.0, 0.0]
        deadline = time.monotonic() + 10
        while len(sleeps(mark)) < 3 and time.monotonic() < deadline:  # the grandchild's exec may come later
            time.sleep(0.05)
        assert len(sleeps(mark)) == 3
        functions.close()
        assert sleeps(mark) == []
        assert f"killed 3 processes left by reward functions ({module}:starts_daemons: 3)" in capfd.readouterr().err
    finally:
        for pid in sleeps(mark):
            os.kill(pid, 9)
