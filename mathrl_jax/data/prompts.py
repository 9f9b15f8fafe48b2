"""Prompt templates: how a question becomes the text the policy continues.

| template     | text                                                                         | from |
|--------------|------------------------------------------------------------------------------|------|
| `plain`      | the question                                                                 | arithmetic ("3+5="), pre-formatted prompts |
| `boxed`      | question + "\\nPlease reason step by step, and put your final answer within \\\\boxed{}." | Qwen2.5-Math's CoT instruction |
| `verl_boxed` | question + " Let's think step by step and output the final answer within \\\\boxed{}." | verl's MATH / GSM8K preprocessing |
| `r1_zero`    | "A conversation between User and Assistant. ... User: {question}\\nAssistant: <think>" | DeepSeek-R1-Zero, as Oat / understand-r1-zero write it |
| `chat`       | the tokenizer's chat template over one user turn holding the `boxed` text    | instruct models |
| `chat_plain` | the tokenizer's chat template over one user turn holding the question        | |

A problem whose prompt is chat messages (`Problem.messages`: the `trl` layout, `--config.data.fields`) is
rendered by `format_messages`, as TRL renders a conversational prompt: the tokenizer's chat template over the
messages as they are (system turn included), with the generation prompt, nothing added, under `plain` and
`chat_plain`. `boxed` / `chat` and `verl_boxed` append their instruction to the last user message first;
`r1_zero` (a text template, no turns) is refused. A tokenizer without a chat template gets `plain_messages`:
the contents joined by newlines.

The string templates are in `TEMPLATES`, with "{question}" where the question goes;
they are filled by plain substitution, not `str.format`, so braces in a question
("\\\\frac{1}{2}") or in a template ("\\\\boxed{}") are kept as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Qwen2.5-Math's chain-of-thought instruction (also its evaluation system prompt)."""

VERL_MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""The instruction verl's data preprocessing scripts append to MATH / GSM8K-style questions."""

R1_ZERO_PREAMBLE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)
"""DeepSeek-R1-Zero's template preamble (DeepSeek-AI 2025, Table 1), in Oat's `apply_r1_template` wording."""

TEMPLATES: dict[str, str] = {
    "plain": "{question}",
    "boxed": "{question}\n" + QWEN_MATH_INSTRUCTION,
    "verl_boxed": "{question} " + VERL_MATH_INSTRUCTION,
    "r1_zero": R1_ZERO_PREAMBLE + "\nUser: {question}\nAssistant: <think>",
}
"""String templates by name; "{question}" marks where the question goes."""

CHAT_TEMPLATES: dict[str, str] = {"chat": "boxed", "chat_plain": "plain"}
"""Templates rendered with the tokenizer's chat template: name -> the string template of the user turn."""

TEMPLATE_NAMES = tuple(sorted(TEMPLATES)) + tuple(sorted(CHAT_TEMPLATES))
"""Every valid `template` argument of `format_prompt`."""


def format_prompt(question: str, template: str = "plain", *, tokenizer: Any = None, system: str | None = None) -> str:
    """The prompt text for `question` under `template` (see the module table).

    Args:
      question: the problem's question.
      template: a name in `TEMPLATE_NAMES`.
      tokenizer: for "chat" / "chat_plain": a transformers tokenizer with a chat
        template; the prompt is `tokenizer.apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True)` with messages [system?, user].
      system: a system message, for the chat templates only.

    Raises:
      ValueError: an unknown template (the message lists the valid ones), a chat
        template without a tokenizer or with one that has no chat template, or a
        system message with a string template.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a string, got {type(question).__name__}: {question!r}")
    if template in TEMPLATES:
        if system is not None:
            raise ValueError(
                f"system={system!r} is used only by the chat templates {sorted(CHAT_TEMPLATES)}, "
                f"not by template {template!r}"
            )
        return TEMPLATES[template].replace("{question}", question)
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; expected one of {', '.join(TEMPLATE_NAMES)}")
    if tokenizer is None:
        raise ValueError(f"template {template!r} needs a tokenizer with a chat template, got tokenizer=None")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"template {template!r}: the tokenizer {type(tokenizer).__name__} has no chat template")
    messages = [] if system is None else [{"role": "system", "content": system}]
    user = TEMPLATES[CHAT_TEMPLATES[template]].replace("{question}", question)
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


MESSAGE_TEMPLATES: dict[str, str] = {
    "plain": "plain",
    "chat_plain": "plain",
    "boxed": "boxed",
    "chat": "boxed",
    "verl_boxed": "verl_boxed",
}
"""Templates a chat-message prompt takes: name -> the string template its last user message is filled into."""


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` is a transformers tokenizer with a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def plain_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """The rendering of chat messages without a chat template: their contents joined by newlines."""
    return "\n".join(m["content"] for m in messages)


def format_messages(messages: Sequence[Mapping[str, str]], template: str = "plain", *, tokenizer: Any = None) -> str:
    """The prompt text of a chat-message prompt (`Problem.messages`) under `template`.

    As TRL's `maybe_apply_chat_template`: `tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)` over the messages as given. `MESSAGE_TEMPLATES` says what the template adds:
    nothing under "plain" / "chat_plain"; under "boxed" / "chat" ("verl_boxed") the last user message becomes
    TEMPLATES["boxed"] (["verl_boxed"]) of its content. With no tokenizer, or one without a chat template,
    `plain_messages` renders the (so amended) messages.

    Raises:
      ValueError: a template a conversation cannot take ("r1_zero", unknown names), or messages without a user turn.
    """
    if template not in MESSAGE_TEMPLATES:
        raise ValueError(
            f"prompt template {template!r} cannot render chat messages (a chat-message prompt is rendered by the "
            f"tokenizer's chat template); expected one of {', '.join(sorted(MESSAGE_TEMPLATES))}"
        )
    turns = [dict(m) for m in messages]
    users = [i for i, m in enumerate(turns) if m.get("role") == "user"]
    if not users:
        raise ValueError(f"no user message in {messages!r}")
    last = turns[users[-1]]
    last["content"] = TEMPLATES[MESSAGE_TEMPLATES[template]].replace("{question}", last["content"])
    if not has_chat_template(tokenizer):
        return plain_messages(turns)
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def problem_prompt(problem: Any, template: str = "plain", *, tokenizer: Any = None, source: str = "the model") -> str:
    """A problem's prompt, the same for training and evaluation: `format_messages` of its chat messages
    (`Problem.messages`), else `format_prompt` of its question. A tokenizer with no chat template renders messages
    as their contents joined by newlines (`plain_messages`), said once on stderr per `source` (its directory)."""
    messages = getattr(problem, "messages", None)
    if messages is None:
        return format_prompt(problem.question, template, tokenizer=tokenizer)
    if not has_chat_template(tokenizer) and source not in _PLAIN_NOTED:
        _PLAIN_NOTED.add(source)
        print(
            f"note: the tokenizer of {source} has no chat template, so chat-message prompts are their contents "
            "joined by newlines (data.prompts.plain_messages)",
            file=sys.stderr,
        )
    return format_messages(messages, template, tokenizer=tokenizer)


_PLAIN_NOTED: set = set()
"""The tokenizers (by directory) whose lack of a chat template was said (once each)."""
