"""Finding the final answer in a text: the last `\\boxed{}`, else an "answer is" / "####" line.

The one `\\boxed{}` parser of the project (`extract_boxed`, also named `last_boxed`):
the grader reads responses and gold solutions with it, and `mathrl_jax.data` reads the
gold answer of a solution (Hendrycks MATH, AReaL-boba) with it. It takes the content
of the **last** `\\boxed{...}` / `\\fbox{...}`, braces matched as LaTeX matches them
(an escaped `\\{` or `\\}` does not count), as verl's `last_boxed_only_string`; also
`\\boxed 5` (no braces) and `\\boxed {5}`. An unfinished last box is no answer.

Plain string scans in the calling process, linear in the text's length (no regex
backtracking, no recursion), so a megabyte of adversarial response costs milliseconds.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# A backslash escape (`\{`, `\}`, `\\`) or a grouping brace.
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)
_WHITESPACE = re.compile(r"\s*")
_SPACED_ARGUMENT = re.compile(r"[ \t]+([^\s$]*)")
_FALLBACK_ANCHORS = re.compile(r"\banswer(?:\s+is\b[ \t]*:?|[ \t]*:)|^####", re.IGNORECASE | re.MULTILINE)
_MINERVA_TAIL = re.compile(r"\.?\s*I hope it is correct.*$", re.IGNORECASE)


def require_str(value, name: str) -> None:
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
        j = _WHITESPACE.match(text, i).end()  # LaTeX skips spaces and newlines before an argument
        if j < len(text) and text[j] == "{":
            return True, _braced_group(text, j)
        if following in (" ", "\t"):  # "\boxed 5": the argument runs to the next whitespace or `$`
            match = _SPACED_ARGUMENT.match(text, i)
            return True, match.group(1).rstrip(".,;") or None
        return True, None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}` in `text`, braces matched (so nested groups stay whole).

    Also `\\boxed 5` (no braces: up to the next whitespace or `$`, less a trailing
    period or comma) and `\\boxed {5}` (whitespace, newlines included, before the
    brace). None when there is no box, or when the last one is unfinished
    (`...\\boxed{\\frac{1}{2` at the end of a truncated response): the last answer the
    response started is the one that counts, as in verl. Escaped braces `\\{`, `\\}`
    do not open or close a group. Returns the raw content (possibly "" for `\\boxed{}`).
    """
    require_str(text, "text")
    return _last_box(text)[1]


last_boxed = extract_boxed
"""The name `mathrl_jax.data` knows the parser by (the gold answer of a solution): the same function."""


def clean_answer(answer: str) -> str:
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
    answer = clean_answer(rest)
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
    require_str(response, "response")
    has_box, boxed = _last_box(response)
    if has_box:
        return (boxed.strip() or None) if boxed is not None else None
    return _fallback_answer(response)


def gold_answer(gold: str) -> str:
    """The gold answer to grade against: the content of its last box if it has one (a full solution), else itself."""
    require_str(gold, "gold")
    answer = gold
    if any(command in gold for command in _BOX_COMMANDS):
        boxed = extract_boxed(gold)
        if boxed is not None and boxed.strip():
            answer = boxed
    answer = clean_answer(answer)
    if not answer:
        raise ValueError(f"gold answer {gold!r} is empty; every sample needs a reference answer")
    return answer
