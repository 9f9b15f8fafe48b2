"""Problem sources: real files of every layout written into tmp_path, read back with `load_problems`."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network, ever
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mathrl_jax.data import sources
from mathrl_jax.data.sources import LAYOUTS, DataError, FieldMapping, Problem, load_problems

# MATH-500 layout (HuggingFaceH4/MATH-500 fields). The levels are the strings one
# copy of MATH-500 stores ("Level 2"); EXPECTED_LEVELS are the normalised ones.
MATH500_RECORDS = [
    {
        "problem": "Convert the point $(0,3)$ to polar coordinates.",
        "solution": "So the answer is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": "Level 2",
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "Write the sum in terms of $p$ and $q.$",
        "solution": "Hence $\\boxed{p - q}$.",
        "answer": "p - q",
        "subject": "Intermediate Algebra",
        "level": "Level 5",
        "unique_id": "test/intermediate_algebra/1994.json",
    },
    {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?",
        "solution": "It is $\\boxed{\\frac{5}{6}}$.",
        "answer": "\\frac{5}{6}",
        "subject": "Algebra",
        "level": "Level 1",
        "unique_id": "test/algebra/1.json",
    },
    {
        "problem": "How many positive divisors does 12 have? A long question " + "x" * 80,
        "solution": "1, 2, 3, 4, 6, 12: $\\boxed{6}$.",
        "answer": "6",
        "subject": "Number Theory",
        "level": "Level 2",
        "unique_id": "test/number_theory/2.json",
    },
]
EXPECTED_LEVELS = ["2", "5", "1", "2"]


def expected_math500(records=MATH500_RECORDS, levels=EXPECTED_LEVELS):
    return [
        Problem(
            uid=r["unique_id"],
            question=r["problem"],
            answer=r["answer"],
            solution=r["solution"],
            level=level,
            subject=r["subject"],
        )
        for r, level in zip(records, levels)
    ]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


def write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "hf_cache")


# ---------------------------------------------------------------------------
# Layouts


def test_math500_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "math500.jsonl", MATH500_RECORDS)
    assert load_problems(path) == expected_math500()
    assert load_problems(path, "math500") == expected_math500()


def test_openr_final_answer_layout_uid_from_stem_and_index(tmp_path):
    records = [{"problem": r["problem"], "final_answer": r["answer"]} for r in MATH500_RECORDS]
    problems = load_problems(write_jsonl(tmp_path / "openr_math.jsonl", records))
    assert [p.uid for p in problems] == [f"openr_math:{i}" for i in range(len(records))]
    assert [(p.question, p.answer) for p in problems] == [(r["problem"], r["final_answer"]) for r in records]
    assert all(p.solution is None and p.level is None and p.subject is None for p in problems)


def test_integer_levels_and_answers_are_strings(tmp_path):
    records = [
        {"problem": f"Problem {i}", "answer": 10 * i, "level": i, "subject": "Algebra", "unique_id": f"id{i}"}
        for i in range(1, 6)
    ]
    problems = load_problems(write_jsonl(tmp_path / "ints.jsonl", records))
    assert [p.level for p in problems] == [str(i) for i in range(1, 6)]
    assert [p.answer for p in problems] == [str(10 * i) for i in range(1, 6)]


GSM8K_RECORDS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 1,000 pens a day for 2 days and 80 on the third. How many pens?",
        "answer": "1000*2 = <<1000*2=2000>>2000\n2000 + 80 = <<2000+80=2080>>2080\n#### 2,080",
    },
    {"question": "Tom owes 5 dollars and pays 8. What is his balance?", "answer": "5-8=-3\n#### -3"},
]


def test_gsm8k_answer_after_hashes(tmp_path):
    problems = load_problems(write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_RECORDS))
    assert [p.answer for p in problems] == ["72", "2080", "-3"]
    for p, r in zip(problems, GSM8K_RECORDS):
        assert p.question == r["question"]
        assert p.solution == r["answer"][: r["answer"].index("####")].strip()
        assert "####" not in p.solution
    assert [p.uid for p in problems] == [f"gsm8k_test:{i}" for i in range(3)]


def test_areal_boba_answer_from_last_box_of_first_solution_and_code_rows_skipped(tmp_path):
    records = [
        {
            "prompt": "Compute half of one.",
            "solutions": ["First \\boxed{3} is wrong; so \\boxed{\\frac{1}{2}}.", "\\boxed{0.5}"],
            "query_id": "q-1",
            "task": "math",
        },
        {"prompt": "Write a sort.", "query_id": "c-1", "task": "code", "input_output": "{}"},
        {"prompt": "What is 6*7?", "solutions": ["6*7 = \\boxed{42}"], "query_id": 17},  # no task: math
    ]
    problems = load_problems(write_jsonl(tmp_path / "boba.jsonl", records))
    assert problems == [
        Problem(uid="q-1", question="Compute half of one.", answer="\\frac{1}{2}", solution=records[0]["solutions"][0]),
        Problem(uid="17", question="What is 6*7?", answer="42", solution="6*7 = \\boxed{42}"),
    ]


def test_hendrycks_math_answer_from_solution(tmp_path):
    records = [
        {
            "problem": "Find $\\sin 60^\\circ$.",
            "solution": "It is $\\boxed{\\dfrac{\\sqrt{3}}{2}}$.",
            "level": "Level 1",
            "type": "Precalculus",
        }
    ]
    (problem,) = load_problems(write_jsonl(tmp_path / "math_train.jsonl", records), "math")
    assert problem.answer == "\\dfrac{\\sqrt{3}}{2}"
    assert (problem.level, problem.subject) == ("1", "Precalculus")


def test_user_field_mapping(tmp_path):
    records = [{"q": "1+1?", "gold": 2, "id": "a"}, {"q": "2+2?", "gold": "4", "id": "b", "why": "sum"}]
    mapping = FieldMapping(question="q", answer="gold", uid="id", solution="why")
    problems = load_problems(write_jsonl(tmp_path / "mine.jsonl", records), mapping)
    assert problems == [Problem("a", "1+1?", "2"), Problem("b", "2+2?", "4", solution="sum")]


def test_field_mapping_with_answer_function(tmp_path):
    records = [{"q": "x?", "gold": "The answer: 12"}]
    mapping = FieldMapping(question="q", answer="gold", answer_fn=lambda v: v.split(":")[1].strip())
    assert load_problems(write_jsonl(tmp_path / "fn.jsonl", records), mapping)[0].answer == "12"


def test_failing_answer_function_names_the_record(tmp_path):
    records = [{"q": "x?", "gold": "12"}, {"q": "y?", "gold": "no colon"}]
    mapping = FieldMapping(question="q", answer="gold", answer_fn=lambda v: v.split(":")[1])
    with pytest.raises(DataError, match="IndexError") as info:
        load_problems(write_jsonl(tmp_path / "fn.jsonl", records[1:]), mapping)
    assert (info.value.line, info.value.field) == (1, "gold")


def test_field_mapping_needs_an_answer_or_a_solution():
    with pytest.raises(ValueError, match="solution field is required"):
        FieldMapping(question="q", answer=None)


# ---------------------------------------------------------------------------
# The same records in every layout `datasets` reads


def test_every_file_layout_gives_the_same_problems(tmp_path, cache_dir):
    datasets = pytest.importorskip("datasets")
    expected = expected_math500()
    ds = datasets.Dataset.from_list(MATH500_RECORDS)

    json_lines = str(tmp_path / "math500.json")
    ds.to_json(json_lines)  # JSON lines, the `datasets` default
    json_array = write_text(tmp_path / "array.json", json.dumps(MATH500_RECORDS, indent=2))
    parquet = str(tmp_path / "math500.parquet")
    ds.to_parquet(parquet)
    saved = str(tmp_path / "saved")
    ds.save_to_disk(saved)
    saved_dict = str(tmp_path / "saved_dict")
    datasets.DatasetDict({"train": ds.select([0]), "test": ds}).save_to_disk(saved_dict)
    repo = tmp_path / "MATH-500"  # a dataset repository folder, as HuggingFaceH4/MATH-500 is
    repo.mkdir()
    write_jsonl(repo / "test.jsonl", MATH500_RECORDS)

    assert load_problems(json_lines) == expected
    assert load_problems(json_array) == expected
    assert load_problems(parquet, cache_dir=cache_dir) == expected
    assert load_problems(saved) == expected
    assert load_problems(saved_dict, split="test") == expected
    assert load_problems(str(repo), cache_dir=cache_dir) == expected
    assert load_problems(str(repo), split="test", cache_dir=cache_dir) == expected


def test_parquet_integer_levels_and_null_optional_fields(tmp_path, cache_dir):
    datasets = pytest.importorskip("datasets")
    records = [
        {"problem": "p0", "answer": "1", "level": 3, "subject": None, "unique_id": "u0"},
        {"problem": "p1", "answer": "2", "level": None, "subject": "Geometry", "unique_id": "u1"},
    ]
    path = str(tmp_path / "ints.parquet")
    datasets.Dataset.from_list(records).to_parquet(path)
    assert load_problems(path, cache_dir=cache_dir) == [
        Problem("u0", "p0", "1", level="3"),
        Problem("u1", "p1", "2", subject="Geometry"),
    ]


# ---------------------------------------------------------------------------
# Malformed files: the error names the file, the line (or row) and the field


def test_malformed_json_line_names_file_and_line(tmp_path):
    lines = [json.dumps(MATH500_RECORDS[0]), "", json.dumps(MATH500_RECORDS[1]), '{"problem": "x", "answer": ']
    path = write_text(tmp_path / "bad.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(DataError) as info:
        load_problems(path)
    assert info.value.line == 4 and info.value.path == path
    assert path in str(info.value) and "line 4" in str(info.value) and "malformed JSON" in str(info.value)


def test_missing_field_names_file_line_and_field(tmp_path):
    broken = dict(MATH500_RECORDS[1])
    del broken["answer"]
    path = write_jsonl(tmp_path / "missing.jsonl", [MATH500_RECORDS[0], broken])
    with pytest.raises(DataError) as info:
        load_problems(path)
    assert (info.value.line, info.value.field) == (2, "answer or final_answer")
    assert f"{path}, line 2, field 'answer or final_answer': missing" in str(info.value)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_file(tmp_path, text):
    path = write_text(tmp_path / "empty.jsonl", text)
    with pytest.raises(DataError, match="empty") as info:
        load_problems(path)
    assert path in str(info.value)


@pytest.mark.parametrize(
    "record, field, message",
    [
        ({"problem": "p", "answer": ["1"]}, "answer", "expected a string or a number"),
        ({"problem": "   ", "answer": "1"}, "problem", "empty"),
        ({"problem": "p", "answer": "1", "level": {"n": 1}}, "level", "expected a string or a number"),
    ],
)
def test_wrong_field_values(tmp_path, record, field, message):
    path = write_jsonl(tmp_path / "typed.jsonl", [MATH500_RECORDS[0], record])
    with pytest.raises(DataError, match=message) as info:
        load_problems(path)
    assert (info.value.line, info.value.field) == (2, field)


def test_line_that_is_not_an_object(tmp_path):
    path = write_text(tmp_path / "list.jsonl", json.dumps(MATH500_RECORDS[0]) + "\n[1, 2]\n")
    with pytest.raises(DataError, match="expected a JSON object") as info:
        load_problems(path)
    assert info.value.line == 2


def test_gsm8k_answer_without_hashes(tmp_path):
    records = [GSM8K_RECORDS[0], {"question": "q", "answer": "no final marker"}]
    with pytest.raises(DataError, match="####") as info:
        load_problems(write_jsonl(tmp_path / "gsm8k.jsonl", records))
    assert (info.value.line, info.value.field) == (2, "answer")


def test_boba_solution_without_box(tmp_path):
    records = [{"prompt": "q", "solutions": ["the answer is 4"], "query_id": "a", "task": "math"}]
    with pytest.raises(DataError, match="boxed") as info:
        load_problems(write_jsonl(tmp_path / "boba.jsonl", records))
    assert (info.value.line, info.value.field) == (1, "solutions")


def test_duplicate_uids(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [MATH500_RECORDS[0], MATH500_RECORDS[1], MATH500_RECORDS[0]])
    with pytest.raises(DataError, match="duplicate uid 'test/precalculus/807.json' \\(first at line 1\\)") as info:
        load_problems(path)
    assert info.value.line == 3


def test_malformed_json_array(tmp_path):
    path = write_text(tmp_path / "array.json", '[\n  {"problem": "p", "answer": "1"},\n  {"problem": \n]')
    with pytest.raises(DataError, match="malformed JSON") as info:
        load_problems(path)
    assert info.value.line == 4


def test_parquet_missing_value_names_row(tmp_path, cache_dir):
    datasets = pytest.importorskip("datasets")
    path = str(tmp_path / "nulls.parquet")
    datasets.Dataset.from_list([{"question": "q0", "answer": "#### 1"}, {"question": "q1", "answer": None}]).to_parquet(
        path
    )
    with pytest.raises(DataError) as info:
        load_problems(path, "gsm8k", cache_dir=cache_dir)
    assert (info.value.row, info.value.field) == (1, "answer")
    assert f"{path}, row 1, field 'answer': null" in str(info.value)


def test_layout_errors(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"text": "t", "label": 1}])
    with pytest.raises(DataError, match="cannot detect the layout from the fields \\['label', 'text'\\]"):
        load_problems(path)
    with pytest.raises(ValueError, match="unknown layout 'math-500'.*'areal_boba', 'gsm8k', 'math', 'math500'"):
        load_problems(path, "math-500")


def test_path_errors(tmp_path, cache_dir):
    datasets = pytest.importorskip("datasets")
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="no such file") as info:
        load_problems(missing)
    assert missing in str(info.value)
    with pytest.raises(DataError, match="unsupported file type"):
        load_problems(write_text(tmp_path / "data.csv", "problem,answer\np,1\n"))
    jsonl = write_jsonl(tmp_path / "m.jsonl", MATH500_RECORDS)
    with pytest.raises(DataError, match="split='test' given, but a single file has no splits"):
        load_problems(jsonl, split="test")

    saved_dict = str(tmp_path / "saved_dict")
    ds = datasets.Dataset.from_list(MATH500_RECORDS)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(saved_dict)
    with pytest.raises(DataError, match="several splits \\['test', 'train'\\]"):
        load_problems(saved_dict)
    with pytest.raises(DataError, match="no split 'validation'; the splits are \\['test', 'train'\\]"):
        load_problems(saved_dict, split="validation")


def test_every_row_skipped_or_filtered_away(tmp_path):
    code_only = [{"prompt": "sort", "query_id": "c", "task": "code"}, {"prompt": "x", "solutions": [], "task": "code"}]
    with pytest.raises(DataError, match="every record was skipped by layout 'areal_boba'"):
        load_problems(write_jsonl(tmp_path / "code.jsonl", code_only), "areal_boba")
    path = write_jsonl(tmp_path / "m.jsonl", MATH500_RECORDS)
    with pytest.raises(DataError, match="no problem of 4 left after filtering"):
        load_problems(path, subjects=["Geometry"])


# ---------------------------------------------------------------------------
# Filters


@pytest.mark.parametrize(
    "subjects, levels, max_chars",
    [
        (None, None, None),
        (["algebra", "NUMBER THEORY"], None, None),
        (None, [2], None),
        (None, ["Level 2", "5"], None),
        (["Precalculus", "Number Theory"], ["2"], None),
        (None, None, 60),
        (["Algebra", "Intermediate Algebra"], [1, 5], 45),
    ],
)
def test_filters_match_an_independent_selection(tmp_path, subjects, levels, max_chars):
    path = write_jsonl(tmp_path / "m.jsonl", MATH500_RECORDS)
    wanted_subjects = None if subjects is None else {s.lower() for s in subjects}
    wanted_levels = None if levels is None else {f"Level {str(v).replace('Level ', '')}" for v in levels}
    expected = [
        p
        for p, r in zip(expected_math500(), MATH500_RECORDS)
        if (wanted_subjects is None or r["subject"].lower() in wanted_subjects)
        and (wanted_levels is None or r["level"] in wanted_levels)
        and (max_chars is None or len(r["problem"]) <= max_chars)
    ]
    got = load_problems(path, subjects=subjects, levels=levels, max_question_chars=max_chars)
    assert got == expected
    assert load_problems(path, subjects=subjects, levels=levels, max_question_chars=max_chars, limit=1) == expected[:1]


def test_token_length_filter_equals_char_filter_for_the_char_tokenizer():
    from mathrl_jax.models.char_tokenizer import build_char_tokenizer

    problems = [Problem(str(i), "1+" * i + "1", str(i + 1)) for i in range(1, 12)]
    tokenizer = build_char_tokenizer()  # one token per character
    for limit in (3, 8, 15, 30):
        by_tokens = sources.filter_problems(problems, max_question_tokens=limit, tokenizer=tokenizer)
        assert by_tokens == sources.filter_problems(problems, max_question_chars=limit)
        assert by_tokens == [p for p in problems if len(p.question) <= limit]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_limits(tmp_path, bad):
    path = write_jsonl(tmp_path / "m.jsonl", MATH500_RECORDS)
    with pytest.raises(ValueError, match=repr(bad)):
        load_problems(path, limit=bad)
    with pytest.raises(ValueError, match=f"max_question_chars must be a positive integer or None, got {bad!r}"):
        load_problems(path, max_question_chars=bad)


# ---------------------------------------------------------------------------
# Boxed answers and layout detection


def balanced(depth=3):
    """Strings whose braces balance, as in LaTeX answers."""
    atom = st.text(alphabet="ab12+-\\^_ ", max_size=4).filter(lambda s: not s.endswith("\\"))  # `\{` is no brace
    return st.recursive(atom, lambda inner: st.tuples(inner, inner, inner).map(lambda t: f"{t[0]}{{{t[1]}}}{t[2]}"))


@given(prefix=balanced(), content=balanced(), suffix=st.text(alphabet="ab }.$", max_size=5))
def test_last_boxed_recovers_the_content(prefix, content, suffix):
    text = f"{prefix} \\boxed{{wrong}} {prefix} \\boxed{{{content}}}{suffix}"
    assert sources.last_boxed(text) == content


def test_last_boxed_without_box_or_unclosed():
    assert sources.last_boxed("the answer is 4") is None
    assert sources.last_boxed("\\boxed{4} then \\boxed{\\frac{1}{2}") is None
    assert sources.last_boxed("\\fbox{7}") == "7"


def test_every_builtin_layout_is_detected_from_its_fields():
    fields = {
        "math500": ["problem", "solution", "answer", "subject", "level", "unique_id"],
        "math": ["problem", "solution", "level", "type"],
        "gsm8k": ["question", "answer"],
        "areal_boba": ["prompt", "solutions", "query_id", "task"],
        "verl": ["data_source", "prompt", "ability", "reward_model", "extra_info"],
        "trl": ["prompt", "solution"],
    }
    assert set(fields) == set(LAYOUTS)
    for name, keys in fields.items():
        assert sources.detect_layout(keys) == name
    assert sources.detect_layout(["problem", "final_answer"]) == "math500"
    assert sources.detect_layout(["text"]) is None


def verl_rows():
    """Rows as verl's preprocessing writes them (DAPO-Math-17k, verl's gsm8k/math examples)."""
    instruction = "Solve the following math problem. Put your answer on its own line after 'Answer:'.\n\n"
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": instruction + "What is 2+3?"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "5", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "a1"},
        },
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Natalia sold 48 clips. How many?"},
            ],
            "ability": "math",
            "reward_model": {"ground_truth": "72", "style": "rule"},
            "extra_info": {"index": "b2"},
        },
    ]


def test_verl_parquet_layout(tmp_path, cache_dir):
    import datasets

    path = str(tmp_path / "train.parquet")
    datasets.Dataset.from_list(verl_rows()).to_parquet(path)
    problems = load_problems(path, cache_dir=cache_dir)  # detected from the fields
    assert [p.question for p in problems] == [r["prompt"][-1]["content"] for r in verl_rows()]
    assert [p.answer for p in problems] == ["5", "72"]
    assert [p.subject for p in problems] == ["math_dapo", "openai/gsm8k"]
    assert [p.uid for p in problems] == ["train:0", "train:1"]
    bad = verl_rows()
    bad[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    bad_path = tmp_path / "bad.jsonl"
    bad_path.write_text("\n".join(json.dumps(r) for r in bad) + "\n")
    with pytest.raises(DataError, match=r"line 2.*reward_model"):
        load_problems(str(bad_path))
