"""Prompt templates, and the chat template of a real tokenizer (the project's char tokenizer, saved and reloaded)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no network, ever

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.data.prompts import TEMPLATE_NAMES, TEMPLATES, format_prompt
from mathrl_jax.models import char_tokenizer

QUESTION = "What is $\\frac{1}{2} + {x}$ when x = 3?"
# The reference texts, as written in Qwen2.5-Math's evaluation and Oat's `apply_r1_template`.
QWEN_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
R1_ZERO_START = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\nUser: "
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("char_tokenizer")
    char_tokenizer.save_char_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


def test_string_templates():
    assert format_prompt(QUESTION) == QUESTION
    assert format_prompt(QUESTION, "plain") == QUESTION
    assert format_prompt(QUESTION, "boxed") == QUESTION + "\n" + QWEN_INSTRUCTION
    assert format_prompt(QUESTION, "verl_boxed") == (
        QUESTION + " Let's think step by step and output the final answer within \\boxed{}."
    )
    assert format_prompt(QUESTION, "r1_zero") == R1_ZERO_START + QUESTION + "\nAssistant: <think>"


@given(question=st.text(alphabet="{}\\x1 =?$%", max_size=20))
def test_question_is_kept_verbatim_braces_included(question):
    for name, template in TEMPLATES.items():
        prefix, suffix = template.split("{question}")
        assert format_prompt(question, name) == prefix + question + suffix


def test_chat_template_of_a_real_tokenizer(tokenizer):
    expected_user = f"<|im_start|>user\n{QUESTION}\n{QWEN_INSTRUCTION}<|im_end|>\n"
    assistant = "<|im_start|>assistant\n"
    assert format_prompt(QUESTION, "chat", tokenizer=tokenizer) == expected_user + assistant
    assert format_prompt(QUESTION, "chat", tokenizer=tokenizer, system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + expected_user + assistant
    )
    assert format_prompt("3+5=", "chat_plain", tokenizer=tokenizer) == (
        "<|im_start|>user\n3+5=<|im_end|>\n" + assistant
    )


def test_chat_prompt_tokenizes_with_whole_control_tokens(tokenizer):
    prompt = format_prompt("3+5=", "chat_plain", tokenizer=tokenizer)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    vocab = char_tokenizer.vocab()
    assert ids.count(vocab["<|im_start|>"]) == 2 and ids.count(vocab["<|im_end|>"]) == 1
    assert tokenizer.decode(ids) == prompt


def test_errors_name_the_bad_value(tokenizer):
    with pytest.raises(ValueError, match="unknown prompt template 'qwen'; expected one of boxed, plain, r1_zero"):
        format_prompt(QUESTION, "qwen")
    with pytest.raises(ValueError, match="'chat' needs a tokenizer"):
        format_prompt(QUESTION, "chat")
    with pytest.raises(ValueError, match="system='Be brief.' is used only by the chat templates"):
        format_prompt(QUESTION, "boxed", system="Be brief.")
    with pytest.raises(TypeError, match="question must be a string, got int: 3"):
        format_prompt(3, "plain")
    without_template = char_tokenizer.build_char_tokenizer()  # a `tokenizers.Tokenizer`: no chat template
    with pytest.raises(ValueError, match="has no chat template"):
        format_prompt(QUESTION, "chat", tokenizer=without_template)
    assert set(TEMPLATE_NAMES) == set(TEMPLATES) | {"chat", "chat_plain"}
