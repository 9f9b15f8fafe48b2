"""TRL's and open-r1's data layouts (`trl`), chat-message prompts and their rendering with a real tokenizer's chat
template, `--config.data.fields` (`parse_fields`), and the held-out split of a training file (issue 48)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no network, ever

import pytest

from mathrl_jax.data import prompts, sources
from mathrl_jax.data.sources import DataError, Problem
from mathrl_jax.models import char_tokenizer
from mathrl_jax.models.codec import TextCodec
from mathrl_jax.train.rollouts import PromptSettings, encode_prompts

SYSTEM = {"role": "system", "content": "You are a careful solver."}


def write_jsonl(directory, name, rows):
    path = directory / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# Each layout: rows as TRL / open-r1 datasets hold them, and the problems they must give (hand-written).
LAYOUT_FILES = {
    "prompt_solution": (
        [
            {"prompt": "What is 2+3?", "solution": "Add them: 2+3=5, so the answer is \\boxed{5}."},
            {"prompt": "Halve 1/2.", "solution": "\\frac{1}{4}"},  # a bare answer (no \boxed): the answer itself
            {"prompt": "Clips?", "solution": "She sold 48/2 = 24 clips.\n#### 1,072"},  # GSM8K's answer text
        ],
        [
            Problem("f:0", "What is 2+3?", "5", solution="Add them: 2+3=5, so the answer is \\boxed{5}."),
            Problem("f:1", "Halve 1/2.", "\\frac{1}{4}"),
            Problem("f:2", "Clips?", "1072", solution="She sold 48/2 = 24 clips."),
        ],
    ),
    "prompt_answer": (
        [
            {"prompt": "What is 6*7?", "answer": "42"},
            {"prompt": "Clips?", "answer": "48/2 = 24 clips.\n#### 72"},
            {"prompt": "Count.", "answer": 12},
        ],
        [
            Problem("f:0", "What is 6*7?", "42"),
            Problem("f:1", "Clips?", "72", solution="48/2 = 24 clips."),
            Problem("f:2", "Count.", "12"),
        ],
    ),
    "messages_solution": (
        [{"prompt": [{"role": "user", "content": "1+1?"}], "solution": "1+1 = \\boxed{2}"}],
        [Problem("f:0", "1+1?", "2", solution="1+1 = \\boxed{2}", messages=({"role": "user", "content": "1+1?"},))],
    ),
    "messages_with_system": (
        [{"prompt": [SYSTEM, {"role": "user", "content": "3*3?", "name": "x"}], "answer": "9", "id": 7}],
        [Problem("f:0", "3*3?", "9", messages=(SYSTEM, {"role": "user", "content": "3*3?"}))],
    ),
    "ground_truth": (
        [{"prompt": "What is 10-4?", "ground_truth": 6}, {"prompt": "Root of 9?", "ground_truth": "3"}],
        [Problem("f:0", "What is 10-4?", "6"), Problem("f:1", "Root of 9?", "3")],
    ),
}


@pytest.mark.parametrize("case", list(LAYOUT_FILES))
def test_trl_files_load_detected_and_named(case, tmp_path):
    rows, expected = LAYOUT_FILES[case]
    path = write_jsonl(tmp_path, "f.jsonl", rows)
    assert sources.detect_layout(rows[0]) == "trl"
    assert sources.load_problems(path) == expected  # "auto"
    assert sources.load_problems(path, "trl") == expected
    messages = [p.messages for p in sources.load_problems(path)]
    assert all(m is None or isinstance(m, tuple) for m in messages)


def test_the_other_layouts_keep_their_detection():
    assert sources.detect_layout(["prompt", "reward_model", "solution"]) == "verl"
    assert sources.detect_layout(["prompt", "solutions", "answer"]) == "areal_boba"
    assert sources.detect_layout(["problem", "answer"]) == "math500"
    assert sources.detect_layout(["question", "answer"]) == "gsm8k"
    assert sources.detect_layout(["prompt", "completion"]) is None  # SFT data: no gold answer


def test_the_answer_column_wins_over_a_solution_column(tmp_path):
    """open-r1's rows with both: `answer` is the gold answer, `solution` the worked text."""
    rows = [
        {"prompt": "p", "solution": "so \\boxed{4}", "answer": "4.0"},
        {"prompt": "q", "solution": "7", "answer": 7},
    ]
    problems = sources.load_problems(write_jsonl(tmp_path, "both.jsonl", rows))
    assert [(p.answer, p.solution) for p in problems] == [("4.0", "so \\boxed{4}"), ("7", None)]


@pytest.mark.parametrize(
    "row, field, message",
    [
        ({"prompt": [{"role": "system", "content": "s"}], "answer": "1"}, "prompt", "no user message"),
        ({"prompt": [{"role": "user", "content": ["part"]}], "answer": "1"}, "prompt", "no user message with text"),
        ({"prompt": "p", "solution": "\\boxed{ }"}, "solution", "an empty \\\\boxed"),
        ({"prompt": "p", "answer": "   "}, "answer", "empty"),
    ],
)
def test_bad_trl_records_name_the_file_line_and_field(row, field, message, tmp_path):
    path = write_jsonl(tmp_path, "bad.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with pytest.raises(DataError, match=message) as raised:
        sources.load_problems(path, "trl")
    assert (raised.value.line, raised.value.field) == (2, field)


# The chat template: a real transformers tokenizer loaded from files (the project's char tokenizer: ChatML).


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    """(ChatML, Qwen2.5-style with a default system turn, no chat template): tokenizer directories."""
    dirs = []
    for template in (char_tokenizer.CHAT_TEMPLATE, QWEN25_STYLE, None):
        directory = tmp_path_factory.mktemp("tokenizer")
        char_tokenizer.save_char_tokenizer(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config.pop("chat_template")
        if template is not None:
            config["chat_template"] = template
        config_path.write_text(json.dumps(config))
        dirs.append(str(directory))
    return dirs


QWEN25_STYLE = (  # Qwen2.5-Instruct's template, tools left out: a default system turn when none is given
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_messages_render_with_the_tokenizers_own_chat_template(tokenizer_dirs):
    chatml, qwen25, _ = (TextCodec(d).tokenizer for d in tokenizer_dirs)
    user = {"role": "user", "content": "3+5="}
    assert prompts.format_messages([SYSTEM, user], tokenizer=chatml) == (
        "<|im_start|>system\nYou are a careful solver.<|im_end|>\n<|im_start|>user\n3+5=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompts.format_messages([user], tokenizer=qwen25) == (
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n3+5=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompts.format_messages([SYSTEM, user], "chat_plain", tokenizer=qwen25) == (
        prompts.format_messages([SYSTEM, user], tokenizer=chatml)
    )
    boxed = prompts.format_messages(
        [SYSTEM, user, {"role": "assistant", "content": "8"}, user], "boxed", tokenizer=chatml
    )
    assert boxed.count(prompts.QWEN_MATH_INSTRUCTION) == 1
    assert boxed.endswith("3+5=\n" + prompts.QWEN_MATH_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n")
    assert prompts.format_messages([user], "chat", tokenizer=chatml) == prompts.format_prompt(
        "3+5=", "chat", tokenizer=chatml
    )


def test_without_a_chat_template_the_contents_are_joined_by_newlines(tokenizer_dirs):
    bare = TextCodec(tokenizer_dirs[2]).tokenizer
    assert not prompts.has_chat_template(bare)
    messages = [SYSTEM, {"role": "user", "content": "3+5="}]
    assert prompts.format_messages(messages, tokenizer=bare) == "You are a careful solver.\n3+5="
    assert prompts.format_messages(messages, "verl_boxed") == (
        "You are a careful solver.\n3+5= " + prompts.VERL_MATH_INSTRUCTION
    )
    with pytest.raises(ValueError, match="prompt template 'r1_zero' cannot render chat messages"):
        prompts.format_messages(messages, "r1_zero", tokenizer=bare)


def test_encode_prompts_says_once_that_a_tokenizer_has_no_chat_template(tokenizer_dirs, capsys):
    codec = TextCodec(tokenizer_dirs[2])
    problem = Problem("a", "3+5=", "8", messages=({"role": "user", "content": "3+5="},))
    text_problem = Problem("b", "2+2=", "4")
    ids = encode_prompts(PromptSettings("plain", 64), codec, [problem, problem, text_problem])
    assert ids == [codec.encode("3+5="), codec.encode("3+5="), codec.encode("2+2=")]
    encode_prompts(PromptSettings("plain", 64), codec, [problem])
    assert capsys.readouterr().err.count("has no chat template") == 1
    chatml = TextCodec(tokenizer_dirs[0])
    with_template = encode_prompts(PromptSettings("plain", 64), chatml, [problem])[0]
    assert chatml.decode(with_template, skip_special_tokens=False) == (
        "<|im_start|>user\n3+5=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "chat template" not in capsys.readouterr().err


# --config.data.fields


def test_parse_fields_maps_each_role(tmp_path):
    mapping = sources.parse_fields(" question:problem , answer:gold,uid:id,level:lvl,subject:topic,solution:work")
    assert (mapping.question, mapping.answer, mapping.uid, mapping.level, mapping.subject, mapping.solution) == (
        "problem",
        "gold",
        "id",
        "lvl",
        "topic",
        "work",
    )
    rows = [
        {"problem": "1+1?", "gold": "\\boxed{2}", "id": "a", "lvl": "Level 3", "topic": "Algebra", "work": "w"},
        {"problem": [SYSTEM, {"role": "user", "content": "2+2?"}], "gold": 4, "id": "b"},
    ]
    problems = sources.load_problems(write_jsonl(tmp_path, "mine.jsonl", rows), mapping)
    assert problems == [
        Problem("a", "1+1?", "\\boxed{2}", solution="w", level="3", subject="Algebra"),  # the answer as it is
        Problem("b", "2+2?", "4", messages=(SYSTEM, {"role": "user", "content": "2+2?"})),
    ]
    solution_only = sources.parse_fields("question:q,solution:s")
    assert solution_only.answer is None
    path = write_jsonl(tmp_path, "s.jsonl", [{"q": "x", "s": "so \\boxed{7}"}])
    assert [p.answer for p in sources.load_problems(path, solution_only)] == ["7"]


@pytest.mark.parametrize(
    "text, named",
    [
        ("question=problem,answer:gold", "'question=problem' is not ROLE:FIELD"),
        ("question:problem,answer:", "'answer:' is not ROLE:FIELD"),
        ("question:problem,gold:answer", "unknown role 'gold'; expected one of question, answer, solution"),
        ("question:a,question:b,answer:c", "the role 'question' is named twice"),
        ("answer:gold", "no question field"),
        ("question:problem,level:lvl", "no answer field"),
        ("", "expected comma-separated ROLE:FIELD pairs"),
    ],
)
def test_parse_fields_refuses_a_bad_mapping_naming_it(text, named):
    with pytest.raises(ValueError, match=named) as raised:
        sources.parse_fields(text)
    assert f"data.fields={text!r}" in str(raised.value)


def test_a_field_the_file_lacks_is_named(tmp_path):
    path = write_jsonl(tmp_path, "mine.jsonl", [{"problem": "1+1?", "answer": "2"}])
    with pytest.raises(DataError, match="field 'gold': missing \\(the record's fields: answer, problem\\)"):
        sources.load_problems(path, sources.parse_fields("question:problem,answer:gold"))
