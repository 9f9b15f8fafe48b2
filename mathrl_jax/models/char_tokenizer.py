"""Character-level tokenizer of the tiny offline Qwen-architecture model.

The offline default trains a small Qwen2 model on procedural arithmetic on a
CPU, with no network and no downloaded tokenizer. One token per character
keeps the vocabulary under 128 ids (a small embedding table), makes sequence
lengths predictable, and makes the model's view of a number exactly its digits.

It is Qwen2's own tokenizer pipeline (NFC, Qwen's split regex, byte-level
pre-tokenizer and decoder, BPE) with a 96-symbol vocabulary and **no merges**,
so BPE can only ever emit single characters. Why not a plain WordLevel model:
transformers 5 loads the tokenizer of any directory whose config.json says
`model_type: qwen2` as `Qwen2Tokenizer`, which rebuilds a byte-level BPE
pipeline from the vocabulary and ignores the pipeline saved in tokenizer.json.
A WordLevel tokenizer would then silently lose every space and newline; this
one is rebuilt into itself, so the tokenizer file alone and the tiny
checkpoint directory give the same ids.

Ids: `SPECIAL_TOKENS` (0, 1, 2), `UNK_TOKEN` (3), then `CHARACTERS` in order.
"""

from __future__ import annotations

import json
import os
import string
from typing import Dict, Union

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen's control tokens, ids 0, 1, 2. `<|endoftext|>` pads; `<|im_end|>` ends a turn (EOS)."""

PAD_TOKEN = SPECIAL_TOKENS[0]
EOS_TOKEN = SPECIAL_TOKENS[2]

UNK_TOKEN = "<|unk|>"
"""Id 3: stands for characters outside `CHARACTERS`, so encoding any text never raises.

A special token, like the others: transformers registers the unk token as one anyway,
and declaring it here keeps the raw and the saved tokenizer identical.
"""

CHARACTERS = (
    string.digits + "+-*/=()[]{}.,^_\\<>!?:;'\"%$&|~#@`" + string.ascii_lowercase + string.ascii_uppercase + " \n"
)
"""The ordered character set: digits, math / LaTeX punctuation, a-z, A-Z, space, newline."""

QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Qwen2's split pattern (transformers `tokenization_qwen2.PRETOKENIZE_REGEX`)."""

MODEL_MAX_LENGTH = 4096
"""Recorded in tokenizer_config.json; longer than any sequence of the arithmetic tasks."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
"""Qwen's ChatML format without Qwen's default system prompt (it would dominate short sequences)."""

_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def byte_level_symbol(char: str) -> str:
    """The symbol byte-level BPE stores for a one-byte `char` (" " -> "Ġ", "\\n" -> "Ċ", "a" -> "a").

    Vocabulary entries must be in this alphabet, as they are in Qwen's own vocabulary.
    """
    ((symbol, _),) = _BYTE_LEVEL.pre_tokenize_str(char)
    return symbol


def vocab() -> Dict[str, int]:
    """Token -> id: `SPECIAL_TOKENS`, `UNK_TOKEN`, then `CHARACTERS` (as byte-level symbols).

    One table fixes every id, so every loader of the saved files agrees by construction.
    """
    tokens = list(SPECIAL_TOKENS) + [UNK_TOKEN] + [byte_level_symbol(c) for c in CHARACTERS]
    return {token: i for i, token in enumerate(tokens)}


def vocab_size() -> int:
    """Number of ids, 4 + len(CHARACTERS); the model's embedding needs at least this many rows."""
    return len(vocab())


def build_char_tokenizer() -> Tokenizer:
    """The character-level `tokenizers.Tokenizer`: Qwen2's pipeline over `vocab()` with no merges.

    - model: BPE with no merges, so every character of `CHARACTERS` is exactly one token
      (spaces and newlines too: "Ġ" and "Ċ"); bytes outside the vocabulary become
      `UNK_TOKEN` (one per run of unknown bytes, `fuse_unk`) instead of raising;
    - normalizer, pre-tokenizer, decoder: exactly those `transformers.Qwen2Tokenizer`
      builds (NFC; Qwen's split regex then byte-level; byte-level decoder), so reloading
      through `Qwen2Tokenizer` changes nothing;
    - special tokens (and `UNK_TOKEN`): registered as special added tokens, so "<|im_start|>"
      in text is matched whole (one id) before pre-tokenisation, as in Qwen, and
      `skip_special_tokens` drops it.

    Hence decode(encode(s), skip_special_tokens=False) == s for every string over
    `CHARACTERS`, and with no special-token spelling in s also one id per character and
    decode(encode(s)) == s (`tokenizers` skips special tokens by default, transformers not).
    """
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab(),
            merges=[],
            unk_token=UNK_TOKEN,
            fuse_unk=True,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            _BYTE_LEVEL,
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS + (UNK_TOKEN,)]
    )
    return tokenizer


def save_char_tokenizer(directory: Union[str, os.PathLike]) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json to `directory`,
    for `transformers.AutoTokenizer.from_pretrained(directory)` offline.

    The config records `CHAT_TEMPLATE`, eos `<|im_end|>`, pad `<|endoftext|>`, unk
    `UNK_TOKEN` and `MODEL_MAX_LENGTH`, as Qwen2.5-Instruct's does. Differences from a
    bare transformers 5 `save_pretrained`, for readers other than transformers 5:
    the chat template goes into tokenizer_config.json (not chat_template.jinja), the
    class is named `PreTrainedTokenizerFast` (transformers 5 calls it `TokenizersBackend`,
    a name transformers 4 does not know), and special_tokens_map.json, which
    transformers 5 no longer writes, is written. transformers is imported here only,
    so importing this module needs `tokenizers` alone.
    """
    from transformers import PreTrainedTokenizerFast

    directory = os.fspath(directory)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_char_tokenizer(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.save_pretrained(directory, save_jinja_files=False)

    config_path = os.path.join(directory, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(config_path, config)
    _write_json(os.path.join(directory, "special_tokens_map.json"), dict(hf_tokenizer.special_tokens_map))


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
