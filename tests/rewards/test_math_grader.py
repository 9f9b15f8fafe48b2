"""The math grader: a table of answer pairs with a mathematician's verdicts, answer extraction, reward values,
the batch API, and the per-call timeout against adversarial responses (from a thread and from a daemonic
`multiprocessing` pool worker), worker deaths and grader crashes."""

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mathrl_jax.rewards import (
    GradeResult,
    MathGrader,
    RewardValues,
    extract_answer,
    extract_boxed,
    grade,
    math_grader,
    reward_value,
)
from tests.rewards.grader_helpers import ADVERSARIAL, MB, grade_timed

C, I, N = "correct", "incorrect", "no_answer"

# (gold, response, verdict). The verdicts are what a mathematician says about the response's final
# answer, written by hand; the responses put it in the forms models use.
TABLE = [
    # fractions and decimals
    ("\\frac{1}{2}", "So \\boxed{0.5}", C),
    ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}", C),
    ("\\frac{1}{2}", "\\boxed{1/2}", C),
    ("\\frac{1}{2}", "\\boxed{\\frac12}", C),
    ("\\frac{1}{2}", "\\boxed{\\tfrac{2}{4}}", C),
    ("\\frac{1}{3}", "\\boxed{0.33}", I),
    ("\\frac{1}{3}", "\\boxed{0.3333}", I),
    ("0.25", "\\boxed{\\frac{1}{4}}", C),
    ("3", "\\boxed{3.0}", C),
    ("3", "\\boxed{4}", I),
    ("-2", "\\boxed{-2}", C),
    ("-2", "\\boxed{2}", I),
    ("1000", "\\boxed{1{,}000}", C),
    ("1000", "\\boxed{1,000}", C),
    ("50\\%", "\\boxed{50\\%}", C),
    ("\\frac{3}{4}", "\\boxed{75\\%}", C),
    # LaTeX forms and symbolic answers
    ("\\sqrt{2}", "\\boxed{\\sqrt 2}", C),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", C),
    ("2", "\\boxed{\\sqrt{4}}", C),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt3}{2}}", C),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt2}{2}}", I),
    ("\\pi", "\\boxed{\\pi}", C),
    ("2\\pi", "\\boxed{6.28}", I),
    ("e", "\\boxed{2.718}", I),
    ("2^{10}", "\\boxed{1024}", C),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", C),
    ("x^2+1", "\\boxed{x^2-1}", I),
    ("a+b", "\\boxed{b+a}", C),
    ("3", "\\boxed{x=3}", C),
    ("y=2x+1", "\\boxed{y = 1 + 2x}", C),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", C),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\boxed{\\begin{pmatrix}2\\\\1\\end{pmatrix}}", I),
    ("\\text{(B)}", "\\boxed{B}", C),
    ("12", "\\boxed{\\text{twelve}}", I),
    ("5", "\\boxed{\\textbf{5}}", C),
    # units
    ("10", "\\boxed{10\\text{ cm}}", C),
    ("5", "\\boxed{5 \\text{ meters}}", C),
    ("90", "\\boxed{90^\\circ}", C),
    ("18", "\\boxed{\\$18}", C),
    ("7", "\\boxed{7\\text{ cm}^2}", C),
    # intervals
    ("[1,2)", "\\boxed{[1, 2)}", C),
    ("[1,2)", "\\boxed{[1,2]}", I),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}", C),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3)}", I),
    ("(0,1)\\cup(2,3)", "\\boxed{(2,3)\\cup(0,1)}", C),
    ("(1,5)", "\\boxed{(1,4)}", I),
    ("x \\in [2, 5]", "\\boxed{[2,5]}", C),
    # sets and lists of solutions
    ("\\{1,2,3\\}", "\\boxed{\\{3,2,1\\}}", C),
    ("\\{1,2\\}", "\\boxed{\\{1,2,3\\}}", I),
    ("1, 2", "\\boxed{2, 1}", C),
    ("1, 2", "\\boxed{1, 3}", I),
    ("3", "\\boxed{1,2,3,4,5}", I),
    ("3", "\\boxed{\\{3, 4\\}}", I),
    # several boxes: the last one is the answer
    ("5", "First \\boxed{3}, wait, actually \\boxed{5}.", C),
    ("3", "First \\boxed{3}, wait, actually \\boxed{5}.", I),
    ("\\frac{1}{2}", "\\boxed{5} then \\boxed{\\frac{1}{2", N),  # the last box is cut off
    ("7", "\\fbox{7}", C),
    ("5", "so \\boxed 5", C),
    ("12", "$\\boxed{12}$.", C),
    ("5", "\\boxed{{5}}", C),
    ("\\frac{\\frac{1}{2}}{3}", "\\boxed{\\frac{1}{6}}", C),  # nested braces
    # no box: the fallbacks
    ("5", "The answer is 5.", C),
    ("5", "Final Answer: The final answer is $5$. I hope it is correct.", C),
    ("5", "Answer: 5", C),
    ("5", "2+3 = 5\n#### 5", C),
    ("5", "The answer is 4.", I),
    ("5", "I think it is five-ish", N),
    ("5", "", N),
    # the gold may be a full solution with a boxed answer
    ("We get $\\boxed{\\frac{1}{2}}$.", "\\boxed{0.5}", C),
]


@pytest.mark.parametrize("gold, response, verdict", TABLE, ids=[f"{i}:{t[1][:30]}" for i, t in enumerate(TABLE)])
def test_grader_verdicts(gold, response, verdict):
    result = grade(response, gold, timeout_s=10.0)
    assert result.status == verdict, result
    assert result.correct == (verdict == C)
    assert (result.extracted is None) == (verdict == N)


# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{1} b \\boxed{\\frac{1}{2}} c", "\\frac{1}{2}"),
        ("\\boxed{\\{1, \\{2\\}\\}}", "\\{1, \\{2\\}\\}"),  # escaped braces do not count
        ("\\boxed{a}\\fbox{b}", "b"),
        ("\\fbox{b} then \\boxed{a}", "a"),
        ("\\boxed 5.", "5"),
        ("\\boxed {7}", "7"),
        ("$\\boxed{\\text{(C)}}$", "\\text{(C)}"),
        ("\\boxed{}", ""),
        ("\\boxed{5} \\boxedwidth=3", "5"),  # another command: look further left
        ("\\boxed{5} and \\boxed{6", None),  # the last box is unfinished
        ("no box here", None),
        ("\\boxed", None),
        ("\\\\boxed{x}", "x"),
        ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),  # an escaped brace left open
        ("\\boxed\n{5}", "5"),  # LaTeX skips the whitespace before the argument
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def balanced(children):
    return st.lists(children, max_size=4).map(lambda parts: "{" + "".join(parts) + "}")


TEXT = st.text(alphabet="ab1+ \\^_", max_size=6).filter(lambda s: not s.endswith("\\"))
BALANCED = st.recursive(
    TEXT, lambda children: st.lists(st.one_of(children, balanced(children)), max_size=4).map("".join)
)


@given(content=BALANCED, prefix=TEXT, suffix=st.text(alphabet="ab1 }", max_size=8))
def test_extract_boxed_returns_any_balanced_content(content, prefix, suffix):
    text = f"{prefix} \\boxed{{0}} then {prefix}\\boxed{{{content}}}{suffix}"
    assert extract_boxed(text) == content


@pytest.mark.parametrize(
    "response, expected",
    [
        ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("Final Answer: The final answer is $3$. I hope it is correct.", "3"),
        ("Step 3: so 9 * $2 = $18. The answer is: 18", "18"),
        ("the answer is 4\nbut then\nthe answer is 5", "5"),
        ("Answer: \\(x=2\\)", "x=2"),
        ("blah\n#### 1,234\n", "1,234"),
        ("\\boxed{7} and the answer is 8", "7"),  # a box wins over the fallbacks
        ("\\boxed{} The answer is 8", None),  # judged by its (empty) box alone
        ("The answer is \\boxed{\\frac{1}{2", None),  # an unfinished box is no answer
        ("answers are hard", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_extraction_is_linear_on_huge_inputs():
    deep = "\\boxed{" + "{" * 200_000 + "1" + "}" * 200_000 + "}"
    text = "x" * MB + "The answer is " + "\\boxed{" * 50_000
    start = time.monotonic()
    assert extract_boxed(deep) == "{" * 200_000 + "1" + "}" * 200_000
    assert extract_answer(text) is None  # the last box never closes, and no line answer follows
    assert extract_answer("y" * MB) is None
    assert time.monotonic() - start < 5.0


# ---------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    "values",
    [RewardValues(), RewardValues(correct=5.0, incorrect=-5.0, no_answer=-5.0), RewardValues(format_reward=0.1)],
)
def test_reward_values(values):
    expected = {"correct": values.correct, "incorrect": values.incorrect, "no_answer": values.no_answer}
    expected["timeout"] = expected["error"] = values.incorrect
    for status, base in expected.items():
        for formatted in (False, True):
            result = GradeResult(status, None if status == "no_answer" else "1", formatted)
            assert reward_value(result, values) == pytest.approx(base + (values.format_reward if formatted else 0.0))


@pytest.fixture(scope="module")
def grader():
    with MathGrader(RewardValues(correct=5.0, incorrect=-5.0, no_answer=-5.0, format_reward=0.5), timeout_s=1.0) as g:
        yield g


def test_batch_keeps_order_and_counts_metrics(grader):
    rows = [(gold, response) for gold, response, _ in TABLE[:8]] + [(g, r) for r, g in ADVERSARIAL[:3]]
    rows += [("5", "The answer is 5."), ("5", "nothing"), ("2", "\\boxed{2}")]
    rows = rows[::2] + rows[1::2]  # interleave the slow and the fast ones
    golds, responses = [g for g, _ in rows], [r for _, r in rows]
    results = grader.grade_batch(responses, golds)
    assert len(results) == len(rows)
    for (gold, response), result in zip(rows, results):  # each in its place: the same verdict alone
        if any(response == r for r, _ in ADVERSARIAL):
            assert result.status in ("timeout", "error")
        else:
            assert result.status == grade(response, gold).status, (gold, response)
    statuses = [r.status for r in results]
    rewards, metrics = grader.rewards(responses, golds)
    assert rewards.dtype == np.float32 and rewards.shape == (len(rows),)
    np.testing.assert_allclose(rewards, [reward_value(r, grader.values) for r in results])
    assert metrics["reward/accuracy"] == pytest.approx(statuses.count("correct") / len(rows))
    assert metrics["reward/no_answer_rate"] == pytest.approx(statuses.count("no_answer") / len(rows))
    assert metrics["reward/timeout_count"] + metrics["reward/error_count"] == 3
    assert metrics["reward/format_rate"] == pytest.approx(np.mean(["\\boxed" in r or "\\fbox" in r for r in responses]))
    assert metrics["reward/mean"] == pytest.approx(float(np.mean(rewards)))


# ---------------------------------------------------------------------------- plain integers without math-verify

# Ways of writing a number n: the plain literal, and forms math-verify reads as n, as another number, or not at all.
FORMS = [
    str,
    lambda n: f"+{n}",
    lambda n: f"-{n}",  # "-0", and "--5" for a negative n
    lambda n: ("-0" if n < 0 else "0") + str(abs(n)),  # a leading zero
    lambda n: f"{n}.",
    lambda n: f"{n}.0",
    lambda n: f"{n}.00001",
    lambda n: f"{n}.9999999",
    lambda n: f"{n:,}",
    lambda n: f"{n}\\%",
    lambda n: f" {n}",
    lambda n: f"{n}e0",
]
FORM = st.one_of(st.just(str), st.sampled_from(FORMS))  # the plain literal half the time
INTEGERS = st.one_of(
    st.integers(-12, 12),
    st.integers(-(10**7), 10**7),
    st.integers(-(10**30), 10**30),
    st.integers(10**98, 10**101).flatmap(lambda n: st.sampled_from([n, -n])),  # around the 100-digit bound
)


def is_plain_integer(s):
    """The fast path's domain, written independently of its regex."""
    try:
        return s == str(int(s)) and len(s.lstrip("-")) <= 100
    except ValueError:
        return False


@st.composite
def numeric_pairs(draw):
    """(gold, answer): the same number, or one near it, each written in one of the FORMS."""
    n = draw(INTEGERS)
    m = n + draw(st.sampled_from([0, 0, 0, 1, -1, 10, -2 * n])) if draw(st.booleans()) else draw(INTEGERS)
    return draw(FORM)(n), draw(FORM)(m)


@settings(max_examples=500, deadline=None)
@given(pair=numeric_pairs())
def test_plain_integer_verdict_is_math_verifys(grader, pair):
    gold, answer = pair
    fast = math_grader._plain_integer_verdict(gold, answer)
    assert (fast is not None) == (is_plain_integer(gold) and is_plain_integer(answer)), pair
    event(f"fast path: {fast}")
    if fast is not None:
        assert (fast, None) == grader._pool.run(gold, answer, 30.0), pair  # the worker: math-verify itself


def test_plain_integers_skip_the_workers_with_the_same_results(monkeypatch):
    responses = ["\\boxed{42}", "so $\\boxed{-7}$.", "\\boxed{ 12 }", "The answer is 5.", "2+3\n#### 6", "\\boxed{0}"]
    responses += ["\\boxed{}", "no answer", "\\boxed{x}", "\\boxed{" + "9" * 101 + "}", "\\boxed{1,000}", "\\boxed{05}"]
    golds = ["42", "-7", "12", "5", "7", "0"] + ["1", "1", "1", "9" * 101, "1000", "We get $\\boxed{5}$."]
    with MathGrader(timeout_s=10.0) as g:
        calls = []
        run = g._pool.run
        monkeypatch.setattr(g._pool, "run", lambda *args: calls.append(args) or run(*args))
        fast = g.grade_batch(responses, golds)
        expected = [("1", "x"), ("9" * 101,) * 2, ("1000", "1,000"), ("5", "05")]
        assert sorted((gold, answer) for gold, answer, _ in calls) == sorted(expected)  # the workers' threads race
        assert [r.status for r in fast] == [C, C, C, C, I, C, N, N, I, C, C, C]
        monkeypatch.setattr(math_grader, "_plain_integer_verdict", lambda gold, answer: None)  # all to math-verify
        assert g.grade_batch(responses, golds) == fast  # status, extracted, formatted, detail
        assert len(calls) == 4 + 10


# ---------------------------------------------------------------------------- timeouts and failures

TIMEOUT_S = 0.5
MARGIN_S = 0.75  # killing the worker and forking a new one takes milliseconds; the rest is a loaded machine


def check_timed(timed):
    for (response, _), (status, seconds) in zip(ADVERSARIAL, timed):
        assert seconds < TIMEOUT_S + MARGIN_S, (response[:40], status, seconds)
    statuses = [status for status, _ in timed]
    assert statuses[:4] == ["timeout"] * 4  # these four hang math-verify for far longer than the timeout
    assert statuses[4:] == ["correct", "no_answer"]


def test_adversarial_responses_time_out_in_a_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(grade_timed(ADVERSARIAL, TIMEOUT_S)))
    thread.start()
    thread.join(timeout=120)
    timed, _ = out[0]
    check_timed(timed)
    assert grade("\\boxed{\\frac{2}{4}}", "0.5").correct  # replaced workers grade as before


def test_adversarial_responses_time_out_in_a_daemonic_pool_worker():
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        timed, daemonic = pool.apply(grade_timed, (ADVERSARIAL, TIMEOUT_S))
    assert daemonic
    check_timed(timed)


def children_of(pid):
    path = f"/proc/{pid}/task/{pid}/children"
    if not os.path.exists(path):
        pytest.skip("needs /proc/PID/task/PID/children (Linux)")
    with open(path) as f:
        return [int(p) for p in f.read().split()]


def wait_dead(pid, timeout_s=10.0):
    """Until `pid` is a zombie or gone (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} is still alive")


def test_dead_workers_and_zygote_are_replaced(grader):
    pool = grader._pool
    assert grader.grade_batch(["\\boxed{1.0}"], ["1"])[0].correct  # 1.0, not a plain integer: graded by a worker
    zygote_pid = pool._zygote.process.pid
    # A worker killed while idle: the next request goes to a fresh one.
    for pid in children_of(zygote_pid):
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid)
    assert [r.status for r in grader.grade_batch(["\\boxed{2.0}", "\\boxed{3.0}"], ["2", "4"])] == [C, I]
    # A worker killed while grading: "error" at once, not a timeout.
    slow = MathGrader(timeout_s=60.0, num_workers=1)
    try:
        assert slow.grade_batch(["\\boxed{1.0}"], ["1"])[0].correct
        results = []
        thread = threading.Thread(target=lambda: results.extend(slow.grade_batch([ADVERSARIAL[2][0]], ["5"])))
        start = time.monotonic()
        thread.start()
        time.sleep(1.0)
        for pid in children_of(slow._pool._zygote.process.pid):
            os.kill(pid, signal.SIGKILL)
        thread.join(timeout=30)
        assert results[0].status == "error" and "died" in results[0].detail
        assert time.monotonic() - start < 10
    finally:
        slow.close()
    # The zygote itself killed: restarted on the next call.
    os.kill(zygote_pid, signal.SIGKILL)
    pool._zygote.process.wait(timeout=10)
    assert grader.grade_batch(["\\boxed{\\frac{1}{4}}"], ["0.25"])[0].correct
    assert pool._zygote.process.pid != zygote_pid


def test_a_crashing_grader_is_an_error_not_an_exception():
    # Workers limited to 64 MiB of address space, less than the interpreter already maps: a 4 MB
    # answer cannot be allocated there (MemoryError, or the worker dies), and that is an "error".
    huge = ["\\boxed{" + digit * (4 * MB) + "}" for digit in "12"]
    with MathGrader(timeout_s=20.0, memory_limit_bytes=64 << 20) as g:
        results = g.grade_batch(huge + ["no answer"], ["1", "2", "1"])
        rewards, metrics = g.rewards(huge + ["no answer"], ["1", "2", "1"])
    assert [r.status for r in results] == ["error", "error", "no_answer"]
    assert metrics["reward/error_count"] == 2
    assert metrics["reward/no_answer_rate"] == pytest.approx(1 / 3)
    np.testing.assert_array_equal(rewards, [0.0, 0.0, 0.0])


def test_bad_input_raises_naming_the_value(grader):
    with pytest.raises(TypeError, match="response must be a str.*None"):
        grade(None, "1")
    with pytest.raises(ValueError, match="gold answer '\\$ \\$' is empty"):
        grade("\\boxed{1}", "$ $")
    with pytest.raises(ValueError, match="timeout_s.*-1"):
        grade("\\boxed{1}", "1", timeout_s=-1)
    with pytest.raises(ValueError, match="num_workers.*0"):
        MathGrader(num_workers=0)
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        grader.grade_batch(["a", "b"], ["1"])
    with pytest.raises(ValueError, match=r"golds\[1\]: gold answer '' is empty"):
        grader.grade_batch(["a", "b"], ["1", ""])
    with pytest.raises(TypeError, match=r"responses\[0\] must be a str, got int"):
        grader.grade_batch([3], ["1"])
    with pytest.raises(ValueError, match="unknown grade status 'maybe'"):
        GradeResult("maybe", None, False)
    closed = MathGrader()
    closed.close()
    closed.close()
    with pytest.raises(RuntimeError, match="after close"):
        closed.grade_batch(["\\boxed{1}"], ["1"])
