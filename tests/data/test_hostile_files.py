"""Data files an adversary (or a broken export) writes, read by `load_problems` (issue 60, point 5): each is one
`DataError` naming the file and line, in bounded time; a file `datasets` reads is read as `datasets` reads it."""

import json
import os
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network, ever
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from mathrl_jax.data import readers, records
from mathrl_jax.data.sources import DataError, load_problems

SECONDS = 60
"""The time any of these files may take to be refused (each takes well under a second or two)."""


def within(seconds, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`'s result or exception, or a failed test after `seconds` (the call may hang: a FIFO
    opened for reading waits for a writer), run in a daemon thread so that a hang does not hang the session."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{fn.__name__} did not return in {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - started


def refused(path, *expected, seconds=SECONDS):
    """The DataError `load_problems(path, "math500")` raises, checked to be one line naming each of `expected`."""
    with pytest.raises(DataError) as info:
        within(seconds, load_problems, path, "math500")
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(str(path)), message
    for part in expected:
        assert part in message, message
    return message


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "hf_cache")


GOOD = json.dumps({"problem": "1+1?", "answer": "2"}).encode() + b"\n"


def write(tmp_path, second_line: bytes, name="data.jsonl"):
    path = tmp_path / name
    path.write_bytes(GOOD + second_line + b"\n")
    return str(path)


def test_a_raw_line_separator_inside_a_string_is_part_of_the_string_as_datasets_reads_it(tmp_path, cache_dir):
    """U+2028 / U+2029 / U+0085 written raw (valid JSON: only < U+0020 must be escaped): `str.splitlines` broke the
    record there ("malformed JSON: Unterminated string"); `datasets`' json loader, which splits at "\\n" alone,
    reads one record whose question holds the character."""
    import datasets

    question = "What is 1\u2028+1\u2029?\x85 (x\x1c y)"
    path = write(tmp_path, json.dumps({"problem": question, "answer": "2"}, ensure_ascii=False).encode())
    problems, _ = within(SECONDS, load_problems, path, "math500")
    theirs = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache_dir)
    assert [p.question for p in problems] == theirs["problem"] == ["1+1?", question]
    assert [p.uid for p in problems] == ["data:0", "data:1"]


def test_a_utf8_byte_order_mark_at_the_start_is_skipped(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD + GOOD.replace(b"1+1", b"2+2"))
    problems, _ = within(SECONDS, load_problems, str(path), "math500")
    assert [p.question for p in problems] == ["1+1?", "2+2?"]
    array = tmp_path / "bom.json"
    array.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"problem": "3+3?", "answer": "6"}]).encode())
    problems, _ = within(SECONDS, load_problems, str(array), "math500")
    assert [p.question for p in problems] == ["3+3?"]


def test_a_json_array_after_much_whitespace_is_still_an_array(tmp_path):
    array = tmp_path / "spaced.json"
    array.write_bytes(b" \n" * 70_000 + json.dumps([{"problem": "3+3?", "answer": "6"}]).encode())
    problems, _ = within(SECONDS, load_problems, str(array), "math500")
    assert [p.question for p in problems] == ["3+3?"]


def test_a_key_given_twice_in_one_object_is_refused(tmp_path):
    """Python's json kept the last "answer" silently (datasets' loader keeps another): which gold was meant?"""
    path = write(tmp_path, b'{"problem": "2+2?", "answer": "4", "answer": "5"}')
    refused(path, "line 2", "duplicate key 'answer'")


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"Infinity", b"NaN"])
def test_a_number_beyond_a_float_is_refused(tmp_path, number):
    """1e400 read as inf: an answer "inf" that no completion matches, or an inf level."""
    path = write(tmp_path, b'{"problem": "2+2?", "answer": ' + number + b"}")
    refused(path, "line 2", number.decode().lstrip("-"))


def test_an_integer_of_more_digits_than_python_reads_is_refused(tmp_path):
    path = write(tmp_path, b'{"problem": "2+2?", "answer": ' + b"9" * 5000 + b"}")
    refused(path, "line 2", "malformed JSON")


def test_a_nesting_too_deep_for_the_parser_is_refused(tmp_path):
    path = write(tmp_path, b'{"problem": "2+2?", "answer": "4", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    refused(path, "line 2", "nested too deeply")


@pytest.mark.parametrize("where", ["value", "key", "nested"])
def test_a_lone_surrogate_escape_is_refused(tmp_path, where):
    """'\\ud800' parses to a str that no tokenizer can encode (UnicodeEncodeError, a traceback, mid-run)."""
    line = {
        "value": b'{"problem": "x \\ud800 y", "answer": "4"}',
        "key": b'{"problem": "2+2?", "answer": "4", "\\udfff": 1}',
        "nested": b'{"problem": "2+2?", "answer": "4", "meta": [{"a": "\\uDC00"}]}',
    }[where]
    path = write(tmp_path, line)
    refused(path, "line 2", "lone surrogate")


def test_a_surrogate_pair_escape_is_text(tmp_path):
    path = write(tmp_path, b'{"problem": "\\ud83d\\ude00 + 1?", "answer": "4"}')
    problems, _ = within(SECONDS, load_problems, path, "math500")
    assert problems[1].question == "\U0001f600 + 1?"


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    """Opening a FIFO for reading waits for a writer: the run hung before printing anything."""
    path = tmp_path / "data.jsonl"
    os.mkfifo(path)
    refused(str(path), "not a regular file or directory (a FIFO)", seconds=10)


def test_a_device_is_refused(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    link = tmp_path / "zeros.jsonl"
    os.symlink("/dev/zero", link)  # endless: read whole, it never ends
    refused(str(link), "character device", seconds=10)


def test_a_50_megabyte_prompt_is_refused_naming_the_limit(tmp_path):
    """Tokenizing it took minutes before the prompt was found too long (or a tokenizer ran out of memory)."""
    path = write(tmp_path, json.dumps({"problem": "1+" * 25_000_000 + "1?", "answer": "x"}).encode())
    message = refused(path, "line 2", "field 'problem'", f"limit of {records.MAX_PROMPT_CHARS}")
    assert "MAX_PROMPT_CHARS" in message


def test_chat_messages_over_the_prompt_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_PROMPT_CHARS", 100)
    messages = [{"role": "system", "content": "s" * 60}, {"role": "user", "content": "u" * 60}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": messages, "answer": "1"}) + "\n")
    with pytest.raises(DataError, match="line 1, field 'prompt': a prompt of 120 characters, over the limit of 100"):
        within(SECONDS, load_problems, str(path), "trl")


def test_a_line_over_the_line_limit_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    path = write(tmp_path, json.dumps({"problem": "1+" * 2000 + "1?", "answer": "x"}).encode())
    refused(path, "line 2", "a line of more than 1000 bytes", "MAX_LINE_BYTES")
    exact = write(tmp_path, json.dumps({"problem": "1" * 960, "answer": "x"}).encode(), name="exact.jsonl")
    problems, _ = within(SECONDS, load_problems, exact, "math500")  # 999 bytes and its "\n": read
    assert len(problems) == 2


def test_line_numbers_count_newlines_only(tmp_path):
    """A U+2028 inside a string is no line break: the broken record after it is named at line 3, as an editor
    (and `datasets`) counts lines."""
    path = tmp_path / "lines.jsonl"
    path.write_bytes(GOOD + '{"problem": "a\u2028b", "answer": "1"}\r\n'.encode() + b"{broken\n")
    refused(str(path), "line 3", "malformed JSON")
