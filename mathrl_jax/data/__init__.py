"""Problems for training and evaluation: local data files, procedural arithmetic, prompt templates.

`load_problems` reads MATH-500 / GSM8K / AReaL-boba layouts (or a mapping of your
own) from local JSONL, JSON, parquet or `datasets` directories; `arithmetic_problems`
makes the offline default data; `ProblemLoader` serves resumable shuffled batches;
`format_prompt` turns a question into the text the policy continues.
"""

from mathrl_jax.data.arithmetic import LEVELS, ArithmeticLevel, arithmetic_problems, arithmetic_train_eval
from mathrl_jax.data.prompts import TEMPLATE_NAMES, TEMPLATES, format_prompt, problem_prompt
from mathrl_jax.data.sources import (
    LAYOUTS,
    DataError,
    FieldMapping,
    Problem,
    ProblemLoader,
    detect_layout,
    filter_problems,
    load_problems,
    normalize_level,
    shuffled_order,
)

__all__ = [
    "LAYOUTS",
    "LEVELS",
    "TEMPLATES",
    "TEMPLATE_NAMES",
    "ArithmeticLevel",
    "DataError",
    "FieldMapping",
    "Problem",
    "ProblemLoader",
    "arithmetic_problems",
    "arithmetic_train_eval",
    "detect_layout",
    "filter_problems",
    "format_prompt",
    "problem_prompt",
    "load_problems",
    "normalize_level",
    "shuffled_order",
]
