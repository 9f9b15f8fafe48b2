"""PRM step scores against the torch `transformers` model of the same checkpoint, batching/padding
invariance, reward modes, truncation, and errors that name the bad value."""

import dataclasses
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mathrl_jax.models import char_tokenizer  # noqa: E402
from mathrl_jax.rewards import PRMConfig, ProcessRewardModel  # noqa: E402

TAG = "@"  # one ASCII character: one token of the char tokenizer
# Every test input fits the 128 bucket: one compilation of the [4, 128] forward serves most tests.
CONFIG = PRMConfig(step_tag=TAG, batch_size=4, min_bucket=128, max_length=256)

QUESTIONS = [
    "What is 2+3?",
    "Compute 7*6 and explain.",
    "Solve x+1=3.",
    "Is 91 prime?",
    "What is 12/4?",
    "Add 1, 2 and 3.",
]
RESPONSES = [
    "2+3=5\n\nThe answer is 5.",
    "7*6=42\n\nCheck: 6*7=42\n\nSo the answer is \\boxed{42}.",
    "Subtract 1 from both sides.\n\nx=2",
    "91=7*13\n\nSo 91 is not prime.\n\nAnswer: no\n\nDone.",
    "12/4=3",
    "1+2=3\n\n3+3=6\n\nThe sum is 6.",
]


@pytest.fixture(scope="module")
def prm(prm_checkpoint):
    directory, _ = prm_checkpoint
    return ProcessRewardModel.from_pretrained(directory, CONFIG)


def reference_step_scores(torch_model, tokenizer, question, steps, max_length=None):
    """OpenR's recipe, written out independently: the whole text through the torch model, then
    softmax over the ("+", "-") logits at every tag position."""
    text = question + " " + "\n".join(f"{step} {TAG}" for step in steps)
    ids = tokenizer.encode(text)
    if max_length is not None:
        ids = ids[-max_length:]
    with torch.no_grad():
        logits = torch_model(torch.tensor([ids])).logits[0].double()
    good, bad = tokenizer.convert_tokens_to_ids("+"), tokenizer.convert_tokens_to_ids("-")
    p_good = torch.softmax(logits[:, [good, bad]], dim=-1)[:, 0].numpy()
    return p_good[np.asarray(ids) == tokenizer.convert_tokens_to_ids(TAG)]


def test_step_scores_match_transformers(prm, prm_checkpoint):
    directory, torch_model = prm_checkpoint
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    steps = [prm.split_steps(r) for r in RESPONSES]
    scores = prm.step_scores(QUESTIONS, steps)
    assert [s.shape for s in scores] == [(len(s),) for s in steps]
    assert all(s.dtype == np.float32 for s in scores)
    for question, sample_steps, ours in zip(QUESTIONS, steps, scores):
        expected = reference_step_scores(torch_model, tokenizer, question, sample_steps)
        assert len(expected) == len(sample_steps)
        np.testing.assert_allclose(ours, expected, atol=2e-5)
    # The check is not vacuous: the random PRM does not score every step alike.
    assert np.std(np.concatenate(scores)) > 0.05


def test_batching_padding_and_tokenizer_kind_do_not_change_scores(prm, prm_checkpoint):
    steps = [prm.split_steps(r) for r in RESPONSES]
    batched = prm.step_scores(QUESTIONS, steps)
    # One at a time: every row padded with a different amount, alone in its batch.
    for i in (0, 3):
        (alone,) = prm.step_scores([QUESTIONS[i]], [steps[i]])
        np.testing.assert_allclose(alone, batched[i], atol=1e-5)
    # Other neighbours in the batch: reversed, and three at a time (the fourth row all padding).
    reversed_scores = prm.step_scores(QUESTIONS[::-1], steps[::-1])[::-1]
    threes = prm.step_scores(QUESTIONS[:3], steps[:3]) + prm.step_scores(QUESTIONS[3:], steps[3:])
    for a, b, c in zip(reversed_scores, threes, batched):
        np.testing.assert_allclose(a, c, atol=1e-5)
        np.testing.assert_allclose(b, c, atol=1e-5)
    # The raw `tokenizers.Tokenizer` gives the same ids, hence the same scores.
    raw = ProcessRewardModel(prm.model, char_tokenizer.build_char_tokenizer(), CONFIG)
    for a, b in zip(raw.step_scores(QUESTIONS, steps), batched):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_reward_modes(prm):
    steps = [prm.split_steps(r) for r in RESPONSES]
    scores = prm.step_scores(QUESTIONS, steps)
    last = prm.rewards(QUESTIONS, RESPONSES)
    lowest = ProcessRewardModel(prm.model, prm.tokenizer, dataclasses.replace(CONFIG, reward_mode="min"))
    every = ProcessRewardModel(prm.model, prm.tokenizer, dataclasses.replace(CONFIG, reward_mode="steps"))
    for s, r_last, r_min, r_steps in zip(
        scores, last, lowest.rewards(QUESTIONS, RESPONSES), every.rewards(QUESTIONS, RESPONSES)
    ):
        assert r_last.shape == (1,) and r_min.shape == (1,)
        np.testing.assert_allclose(r_last[0], s[-1], atol=1e-6)
        np.testing.assert_allclose(r_min[0], s.min(), atol=1e-6)
        np.testing.assert_allclose(r_steps, s, atol=1e-6)


def test_split_steps_and_input_format(prm):
    assert prm.split_steps("a\n\n\n\n b \n\nc\n\n") == ["a", "b", "c"]
    assert prm.split_steps("one step") == ["one step"]
    assert prm.split_steps("  \n\n ") == [""]
    assert prm.format_input("Q?", ["s1", "s2"]) == "Q? s1 @\ns2 @"
    # A tag written inside the text would add a score position: it is removed.
    assert prm.format_input("Q@?", ["s@1"]) == "Q? s1 @"
    with_tag = prm.step_scores(["Q?"], [["a @ b", "c"]])[0]
    without = prm.step_scores(["Q?"], [["a  b", "c"]])[0]
    np.testing.assert_allclose(with_tag, without, atol=1e-6)


def test_truncation_keeps_the_last_steps(prm, prm_checkpoint):
    directory, torch_model = prm_checkpoint
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    short = ProcessRewardModel(prm.model, prm.tokenizer, dataclasses.replace(CONFIG, max_length=34, min_bucket=16))
    question = "Q" * 30
    steps = ["a+b", "b+c", "c+d", "d+e", "e+f", "f+g", "g+h"]
    (scores,) = short.step_scores([question], [steps])
    # 31 + 7 * 5 + 6 = 72 tokens: the first 38 are dropped, and with them the first tag (token 35).
    expected = reference_step_scores(torch_model, tokenizer, question, steps, max_length=34)
    n_lost = len(steps) - len(expected)
    assert n_lost == 1
    assert np.isnan(scores[:n_lost]).all()
    np.testing.assert_allclose(scores[n_lost:], expected, atol=2e-5)
    lowest = ProcessRewardModel(prm.model, prm.tokenizer, dataclasses.replace(short.config, reward_mode="min"))
    (reward,) = lowest.rewards([question], ["\n\n".join(steps)])
    np.testing.assert_allclose(reward, [np.nanmin(scores)], atol=1e-6)


def test_bad_configs_and_inputs_raise_naming_the_value(prm, prm_checkpoint, tmp_path):
    directory, _ = prm_checkpoint
    with pytest.raises(ValueError, match="'@@'.*2 tokens"):
        ProcessRewardModel(prm.model, prm.tokenizer, dataclasses.replace(CONFIG, step_tag="@@"))
    # The char tokenizer has no "ки": transformers drops it, the raw tokenizer maps it to <|unk|>.
    with pytest.raises(ValueError, match="'ки' is 0 tokens"):
        ProcessRewardModel(prm.model, prm.tokenizer, PRMConfig())
    with pytest.raises(ValueError, match="'ки' is the unknown token"):
        ProcessRewardModel(prm.model, char_tokenizer.build_char_tokenizer(), PRMConfig())
    with pytest.raises(ValueError, match="'best'"):
        PRMConfig(reward_mode="best")
    with pytest.raises(ValueError, match=r"\('\+',\)"):
        PRMConfig(candidate_tokens=("+",))
    with pytest.raises(ValueError, match="max_length.*1"):
        PRMConfig(max_length=1)
    with pytest.raises(ValueError, match="2 questions but 1 responses"):
        prm.rewards(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"steps\[0\] is empty"):
        prm.step_scores(["a"], [[]])
    with pytest.raises(TypeError, match="response must be a str"):
        prm.split_steps(None)
    with pytest.raises(FileNotFoundError, match="no/such/dir"):
        ProcessRewardModel.from_pretrained("/no/such/dir", CONFIG)
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(directory, name), weights_only / name)
    with pytest.raises(ValueError, match="weights_only.*no tokenizer files"):
        ProcessRewardModel.from_pretrained(str(weights_only), CONFIG)
