"""ProblemLoader: shuffled epochs, and exact resume from a JSON state across epoch boundaries."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.data import arithmetic_problems
from mathrl_jax.data.sources import Problem, ProblemLoader, load_problems, shuffled_order


def make_problems(n):
    return [Problem(uid=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(n)]


def uids(batch):
    return [p.uid for p in batch]


@pytest.mark.parametrize("n, batch", [(7, 3), (10, 10), (5, 12), (1, 4)])
def test_each_epoch_visits_every_problem_once(n, batch):
    problems = make_problems(n)
    loader = ProblemLoader(problems, seed=3)
    stream = [p for _ in range(6) for p in loader.next_batch(batch)]
    epochs = [stream[i : i + n] for i in range(0, len(stream) - n + 1, n)]
    assert len(epochs) >= 2
    for e, epoch in enumerate(epochs):
        assert sorted(uids(epoch)) == sorted(uids(problems))
        assert epoch == [problems[i] for i in shuffled_order(n, 3, e)]


def test_order_is_deterministic_and_depends_on_seed_and_epoch():
    problems = make_problems(50)
    first = [uids(ProblemLoader(problems, seed=0).next_batch(100)) for _ in range(2)]
    assert first[0] == first[1]
    assert first[0][:50] != first[0][50:]  # epochs are reshuffled (equal with probability 1/50!)
    assert first[0] != uids(ProblemLoader(problems, seed=1).next_batch(100))
    assert first[0][:50] != uids(problems)


def test_no_shuffle_is_file_order():
    problems = make_problems(5)
    assert uids(ProblemLoader(problems, seed=0, shuffle=False).next_batch(12)) == uids(problems * 3)[:12]


def test_shuffled_order_is_a_permutation():
    for n in (0, 1, 2, 17, 300):
        assert sorted(shuffled_order(n, seed=5, epoch=2)) == list(range(n))


@given(
    n=st.integers(1, 12),
    seed=st.integers(-(2**40), 2**40),
    batch_sizes=st.lists(st.integers(1, 9), min_size=2, max_size=12),
    stop=st.integers(0, 11),
    shuffle=st.booleans(),
)
def test_resume_from_json_state_matches_an_uninterrupted_loader(n, seed, batch_sizes, stop, shuffle):
    problems = make_problems(n)
    stop = min(stop, len(batch_sizes) - 1)
    uninterrupted = ProblemLoader(problems, seed=seed, shuffle=shuffle)
    expected = [uids(uninterrupted.next_batch(b)) for b in batch_sizes]

    first = ProblemLoader(problems, seed=seed, shuffle=shuffle)
    got = [uids(first.next_batch(b)) for b in batch_sizes[:stop]]
    saved = json.dumps(first.state())
    del first
    resumed = ProblemLoader(make_problems(n), seed=seed, shuffle=shuffle)  # a fresh loader, fresh list
    resumed.restore(json.loads(saved))
    got += [uids(resumed.next_batch(b)) for b in batch_sizes[stop:]]
    assert got == expected
    assert resumed.state() == uninterrupted.state()


def test_resume_across_epoch_boundaries_with_problems_reloaded_from_a_file(tmp_path):
    path = tmp_path / "problems.jsonl"
    with open(path, "w") as f:
        f.writelines(json.dumps({"question": f"What is {i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(7))
    uninterrupted = ProblemLoader(load_problems(str(path)), seed=11)
    expected = [uids(uninterrupted.next_batch(3)) for _ in range(8)]  # 24 problems: 3+ epochs

    loader = ProblemLoader(load_problems(str(path)), seed=11)
    head = [uids(loader.next_batch(3)) for _ in range(3)]
    state_file = tmp_path / "loader_state.json"
    state_file.write_text(json.dumps(loader.state()))
    assert json.loads(state_file.read_text()) == {"epoch": 1, "position": 2, "seed": 11, "num_problems": 7}

    resumed = ProblemLoader(load_problems(str(path)), seed=11)
    resumed.restore(json.loads(state_file.read_text()))
    assert head + [uids(resumed.next_batch(3)) for _ in range(5)] == expected
    assert resumed.epoch == 3


def test_restore_accepts_the_minimal_state():
    loader = ProblemLoader(make_problems(6), seed=2)
    loader.next_batch(8)
    reference = loader.next_batch(5)
    fresh = ProblemLoader(make_problems(6), seed=2)
    fresh.restore({"epoch": 1, "position": 2})
    assert fresh.next_batch(5) == reference


@pytest.mark.parametrize(
    "state, message",
    [
        ({"position": 0}, "has no 'epoch'"),
        ({"epoch": 0, "position": -1}, "'position' must be a non-negative integer, got -1"),
        ({"epoch": 1.5, "position": 0}, "'epoch' must be a non-negative integer, got 1.5"),
        ({"epoch": 0, "position": 6}, "position 6 is not below the 6 problems"),
        ({"epoch": 0, "position": 0, "seed": 9}, "seed 9, this loader has seed 2"),
        ({"epoch": 0, "position": 0, "num_problems": 7}, "is for 7 problems, this loader has 6"),
    ],
)
def test_restore_rejects_bad_states(state, message):
    loader = ProblemLoader(make_problems(6), seed=2)
    with pytest.raises(ValueError, match=message):
        loader.restore(state)
    assert loader.state()["epoch"] == 0 and loader.state()["position"] == 0  # unchanged


def test_restore_rejects_a_non_mapping():
    with pytest.raises(TypeError, match="loader state must be a mapping, got \\[0, 0\\]"):
        ProblemLoader(make_problems(6), seed=2).restore([0, 0])


def test_constructor_and_batch_errors():
    with pytest.raises(ValueError, match="at least one problem"):
        ProblemLoader([], seed=0)
    with pytest.raises(ValueError, match="seed must be an integer, got '0'"):
        ProblemLoader(make_problems(2), seed="0")
    loader = ProblemLoader(make_problems(2), seed=0)
    for bad in (0, -1, 1.0):
        with pytest.raises(ValueError, match=f"batch size must be a positive integer, got {bad!r}"):
            loader.next_batch(bad)


def test_loader_over_arithmetic_problems():
    problems = arithmetic_problems(20, seed=0)
    loader = ProblemLoader(problems, seed=0)
    assert sorted(p.uid for p in loader.next_batch(20)) == sorted(p.uid for p in problems)
