"""Tests of the character-level tokenizer, with the real `tokenizers` and `transformers`."""

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no network, ever

import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mathrl_jax.models import char_tokenizer as ct  # noqa: E402

ROUND_TRIP_TEXTS = [
    "12+3",
    "What is 37 * 14 - 5?\n",
    "  leading and trailing spaces  ",
    "a\n\nb\n",
    "x = (3 + 4) / 2, y = -1.5; z = 2^{10} % 7",
    "The answer is $\\boxed{\\frac{1}{2}}$.",
    "\\sqrt[3]{x_1} \\leq |y| & a \\neq b ~ #1 @ `c`",
    'It\'s "quoted" , spaced . punctuation ! ?',
    "",
    " ",
    "\n",
    ct.CHARACTERS,
]

CHAT_USER_1P1 = "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def raw():
    return ct.build_char_tokenizer()


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("char_tokenizer")
    ct.save_char_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def hf(saved_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(saved_dir)


@pytest.fixture(scope="module")
def hf_in_qwen2_checkpoint(tmp_path_factory):
    """The tokenizer saved next to a Qwen2 config.json, as in the tiny checkpoint directory."""
    from transformers import AutoTokenizer, Qwen2Config

    directory = tmp_path_factory.mktemp("qwen2_checkpoint")
    ct.save_char_tokenizer(directory)
    Qwen2Config(
        vocab_size=128,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    ).save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


# --- vocabulary -------------------------------------------------------------------------


def test_vocab_layout():
    table = ct.vocab()
    assert [table[t] for t in ct.SPECIAL_TOKENS] == [0, 1, 2]
    assert table[ct.UNK_TOKEN] == 3
    assert len(set(ct.CHARACTERS)) == len(ct.CHARACTERS)
    assert sorted(table.values()) == list(range(len(table)))
    assert ct.vocab_size() == len(ct.SPECIAL_TOKENS) + 1 + len(ct.CHARACTERS) < 128
    for required in "0123456789+-*/=()[]{}.,^_\\<>!?:;'\"%$&|~# \nazAZ":
        assert required in ct.CHARACTERS, repr(required)


def test_raw_tokenizer_vocab_matches_table(raw):
    assert raw.get_vocab(with_added_tokens=True) == ct.vocab()
    assert raw.get_vocab_size(with_added_tokens=True) == ct.vocab_size()


# --- raw tokenizers.Tokenizer -----------------------------------------------------------


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip_and_one_token_per_character(raw, text):
    ids = raw.encode(text).ids
    assert len(ids) == len(text)
    assert raw.decode(ids) == text


def test_each_character_has_its_own_id(raw):
    ids = raw.encode(ct.CHARACTERS).ids
    assert ids == list(range(4, 4 + len(ct.CHARACTERS)))
    assert raw.encode("12+3").ids == [ct.vocab()["1"], ct.vocab()["2"], ct.vocab()["+"], ct.vocab()["3"]]


@given(st.text(alphabet=ct.CHARACTERS, max_size=200))
def test_round_trip_property(raw, text):
    """Text can spell a special token ("<|endoftext|>" is all in CHARACTERS; hypothesis finds it):
    it is then one id, and only decoding with skip_special_tokens=False gives the text back."""
    ids = raw.encode(text).ids
    assert raw.decode(ids, skip_special_tokens=False) == text
    if not any(token in text for token in ct.SPECIAL_TOKENS + (ct.UNK_TOKEN,)):
        assert len(ids) == len(text)
        assert all(i >= 4 for i in ids)
        assert raw.decode(ids) == text


def test_special_token_spelled_in_text_is_one_id(raw):
    assert raw.encode("1<|endoftext|>2").ids == [ct.vocab()["1"], 0, ct.vocab()["2"]]
    assert raw.encode("<|unk|>").ids == [3]
    assert raw.decode([0, 3], skip_special_tokens=False) == "<|endoftext|><|unk|>"


def test_special_tokens_are_single_ids_not_split(raw):
    for i, token in enumerate(ct.SPECIAL_TOKENS):
        assert raw.encode(token).ids == [i]
    a, b = ct.vocab()["a"], ct.vocab()["b"]
    assert raw.encode("a<|im_end|>b<|endoftext|>").ids == [a, 2, b, 0]
    assert raw.encode("<|im_start|>user\n").ids[0] == 1
    assert raw.encode("<|im_start|>user\n").tokens[0] == "<|im_start|>"


@pytest.mark.parametrize("char", ["é", "\N{GRINNING FACE}", "\t", "\N{GREEK SMALL LETTER PI}"])
def test_unknown_character_is_unk(raw, char):
    one, two = ct.vocab()["1"], ct.vocab()["2"]
    assert raw.encode(char).ids == [3]
    assert raw.encode("1" + char + "2").ids == [one, 3, two]


def test_decode_skip_special_tokens(raw):
    ids = raw.encode("<|im_start|>user\n1+1<|im_end|>\n<|endoftext|>").ids
    assert raw.decode(ids, skip_special_tokens=True) == "user\n1+1\n"
    assert raw.decode(ids, skip_special_tokens=False) == "<|im_start|>user\n1+1<|im_end|>\n<|endoftext|>"


def test_import_does_not_need_transformers():
    """The module file alone (not the package __init__, which others own) imports no transformers."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('char_tokenizer', {ct.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "module.build_char_tokenizer()\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- saved files and transformers.AutoTokenizer ------------------------------------------


def test_saved_files(saved_dir):
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(os.listdir(saved_dir))
    config = json.loads((saved_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == ct.CHAT_TEMPLATE
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert config["model_max_length"] == ct.MODEL_MAX_LENGTH
    special = json.loads((saved_dir / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>" and special["pad_token"] == "<|endoftext|>"


def test_autotokenizer_loads_same_vocab_and_specials(hf):
    assert hf.get_vocab() == ct.vocab()
    assert len(hf) == ct.vocab_size()
    assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == 2
    assert hf.pad_token == "<|endoftext|>" and hf.pad_token_id == 0
    assert hf.unk_token == ct.UNK_TOKEN and hf.unk_token_id == 3
    assert hf.model_max_length == ct.MODEL_MAX_LENGTH


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS + ["<|im_start|>user\n 2 + 2<|im_end|>\n", "naïve é"])
def test_autotokenizer_ids_match_raw(raw, hf, text):
    ids = hf.encode(text)
    assert ids == raw.encode(text).ids
    assert hf(text)["input_ids"] == ids  # no BOS/EOS added by a post-processor
    assert hf.decode(ids) == raw.decode(ids, skip_special_tokens=False)


@given(st.text(alphabet=ct.CHARACTERS, max_size=100))
def test_autotokenizer_round_trip_property(raw, hf, text):
    ids = hf.encode(text)
    assert ids == raw.encode(text).ids
    assert hf.decode(ids) == text


def test_chat_template_exact_chatml(hf, raw):
    messages = [{"role": "user", "content": "1+1"}]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == CHAT_USER_1P1
    assert hf.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\n1+1<|im_end|>\n"
    ids = hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids == raw.encode(CHAT_USER_1P1).ids
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1


def test_multi_turn_chat_template(hf):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2*3"},
        {"role": "assistant", "content": "6"},
    ]
    assert hf.apply_chat_template(messages, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2*3<|im_end|>\n<|im_start|>assistant\n6<|im_end|>\n"
    )


def test_batch_padding_uses_id_zero(hf):
    batch = hf(["1", "123"], padding=True)
    one, two, three = (ct.vocab()[c] for c in "123")
    assert batch["input_ids"] == [[one, 0, 0], [one, two, three]]
    assert batch["attention_mask"] == [[1, 0, 0], [1, 1, 1]]


def test_hf_decode_skip_special_tokens(hf):
    ids = hf.encode(CHAT_USER_1P1 + "2<|im_end|><|endoftext|><|endoftext|>")
    assert hf.decode(ids, skip_special_tokens=True) == "user\n1+1\nassistant\n2"
    assert hf.decode(ids) == CHAT_USER_1P1 + "2<|im_end|><|endoftext|><|endoftext|>"


# --- next to a Qwen2 config.json: transformers 5 rebuilds it as Qwen2Tokenizer -------------


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS + [CHAT_USER_1P1])
def test_qwen2_checkpoint_directory_gives_same_ids(raw, hf_in_qwen2_checkpoint, text):
    tok = hf_in_qwen2_checkpoint
    assert tok.get_vocab() == ct.vocab()
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0
    ids = tok.encode(text)
    assert ids == raw.encode(text).ids
    assert tok.decode(ids) == text


def test_qwen2_checkpoint_directory_chat_template(hf_in_qwen2_checkpoint):
    messages = [{"role": "user", "content": "1+1"}]
    rendered = hf_in_qwen2_checkpoint.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == CHAT_USER_1P1


def test_qwen2_checkpoint_directory_unknown_character_does_not_raise(hf_in_qwen2_checkpoint):
    """Qwen2Tokenizer's BPE has no unk token: unknown characters are dropped, not mapped to id 3."""
    one, two = ct.vocab()["1"], ct.vocab()["2"]
    assert hf_in_qwen2_checkpoint.encode("1é2") in ([one, two], [one, 3, two])
