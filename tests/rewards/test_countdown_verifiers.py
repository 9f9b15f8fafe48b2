"""The countdown task's verifiers: the outcome grader (MathGrader's interface, a valid derivation of the target) and
the rule-based process verifier (ProcessRewardModel.step_scores's interface, the first wrong step marked)."""

import numpy as np
import pytest

from mathrl_jax.data.countdown import countdown_problems, parse_instance, teacher
from mathrl_jax.rewards.countdown_grader import CountdownGrader, countdown_reward, grade
from mathrl_jax.rewards.countdown_steps import NAME, STEP_SEPARATOR, CountdownStepVerifier
from mathrl_jax.rewards.math_grader import RewardValues

GOLD = "3,7,5->26"


def test_grader_verdicts():
    assert grade("7*3=21,21+5=26,\\boxed{26}", GOLD).status == "correct"
    assert grade("7*3=21,21+5=26,\\boxed{26}", GOLD + ":").status == "correct"  # a question reads too
    copied = grade("\\boxed{26}", GOLD)  # the math grader would call this right: the target is in the prompt
    assert copied.status == "incorrect" and copied.extracted == "26" and copied.formatted
    assert grade("7*3=21,21+5=26", GOLD).status == "no_answer"
    assert grade("7*3=21,21+5=26,\\boxed{}", GOLD).formatted is False
    assert grade("3*7=21,21+3=24,\\boxed{24}", GOLD).status == "incorrect"


def test_grader_rewards_and_metrics_follow_the_values():
    responses = ["7*3=21,21+5=26,\\boxed{26}", "\\boxed{26}", "no answer"]
    with CountdownGrader(RewardValues(correct=5.0, incorrect=-5.0, no_answer=-6.0, format_reward=0.5)) as grader:
        rewards, metrics = grader.rewards(responses, [GOLD] * 3)
    np.testing.assert_allclose(rewards, [5.5, -4.5, -6.0])
    assert rewards.dtype == np.float32
    assert metrics["reward/accuracy"] == pytest.approx(1 / 3)
    assert metrics["reward/no_answer_rate"] == pytest.approx(1 / 3)
    assert metrics["reward/format_rate"] == pytest.approx(2 / 3)


def test_grader_refuses_misuse():
    grader = CountdownGrader()
    with pytest.raises(ValueError, match="pair 1"):
        grader.grade_batch(["a", "b"], [GOLD, "26"])  # a gold that is not an instance
    with pytest.raises(ValueError, match="2 responses but 1"):
        grader.grade_batch(["a", "b"], [GOLD])
    with pytest.raises(TypeError):
        grader.grade_batch("a", GOLD)
    with pytest.raises(TypeError):
        CountdownGrader(values=1.0)


def test_grader_agrees_with_the_teacher_and_the_reference_solutions():
    problems = countdown_problems(200, seed=1, count=4)
    grader = CountdownGrader()
    golds = [p.answer for p in problems]
    assert all(r.correct for r in grader.grade_batch([p.solution for p in problems], golds))
    taught = teacher.teacher_solutions([p.question for p in problems])
    verdicts = [r.correct for r in grader.grade_batch(taught, golds)]
    assert verdicts == [teacher.teacher_solves(parse_instance(g)) for g in golds]
    assert countdown_reward(completions=taught, answer=golds, question=[p.question for p in problems]) == [
        float(v) for v in verdicts
    ]


def _steps(text):
    return [s.strip() for s in text.split(STEP_SEPARATOR)]


def test_step_verifier_marks_the_first_wrong_step():
    verifier = CountdownStepVerifier()
    samples = [
        "7*3=21,21+5=26,\\boxed{26}",  # right
        "7*3=21,21+5=27,\\boxed{27}",  # wrong arithmetic at step 2
        "7*3=21,21+3=24,\\boxed{24}",  # a number used twice at step 2
        "3+7=10,10*5=50,\\boxed{50}",  # valid steps, but after the first 26 is out of reach
        "7*3=21,\\boxed{21}",  # 5 skipped: the boxed step is wrong
        "\\boxed{26}",  # the target copied without steps
        "7*3=21,21+5=26,\\boxed{26},1+1=2",  # a step after the answer
    ]
    scores = verifier.step_scores(["3,7,5->26:"] * len(samples), [_steps(s) for s in samples])
    expected = [[1, 1, 1], [1, 0, 0], [1, 0, 0], [0, 0, 0], [1, 0], [0], [1, 1, 1, 0]]
    assert [s.tolist() for s in scores] == expected
    assert all(s.dtype == np.float32 and s.shape == (len(e),) for s, e in zip(scores, expected))


def test_step_verifier_on_the_teachers_solutions_and_odd_input():
    problems = countdown_problems(100, seed=2, count=3)
    taught = teacher.teacher_solutions([p.question for p in problems])
    scores = CountdownStepVerifier().step_scores([p.question for p in problems], [_steps(t) for t in taught])
    for p, row in zip(problems, scores):
        # All good exactly when the teacher is right; else some step is marked, and everything after it
        assert bool(row.all()) == teacher.teacher_solves(parse_instance(p.question))
        first_bad = int(np.argmin(row)) if not row.all() else len(row)
        assert not row[first_bad:].any() and row[:first_bad].all()
    assert [s.tolist() for s in CountdownStepVerifier().step_scores(["57+38=", "3,7,5->26:"], [["a", "b"], []])] == [
        [0.0, 0.0],
        [],
    ]
    with pytest.raises(ValueError, match="2 questions but 1"):
        CountdownStepVerifier().step_scores(["a", "b"], [[]])
    assert NAME == "countdown_steps" and STEP_SEPARATOR == ","
