"""Text <-> token ids with a local Hugging Face tokenizer, as the loop needs them."""

from __future__ import annotations

from typing import Dict, List

from mathrl_jax.errors import MathRLError


class TokenizerError(MathRLError, ValueError):
    """A tokenizer directory that cannot serve the loop (missing files, no eos token); the message names it."""


def fail(message: str):
    raise TokenizerError(message)


class TextCodec:
    """Encode / decode with a local Hugging Face tokenizer, without adding special tokens."""

    def __init__(self, directory: str):
        import transformers

        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception as error:  # transformers raises OSError / ValueError for a missing or broken tokenizer
            fail(f"no usable tokenizer in {directory!r}: {error}")
        tok = self.tokenizer
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if self.eos_token_id is None:
            fail(f"the tokenizer in {directory!r} has no eos token")
        if not self.encode("1 + 1 = 2"):  # transformers builds an empty tokenizer from config.json alone
            fail(
                f"the tokenizer in {directory!r} encodes text to no tokens: no tokenizer files there? (expected "
                "tokenizer.json, or vocab.json and merges.txt, beside config.json)"
            )
        self.directory = directory
        self._token_texts: Dict[int, str] = {}

    def check_vocabulary(self, vocab_size: int, model_dir: str) -> None:
        """Every id the tokenizer can produce indexes the model's embedding (`vocab_size` rows)."""
        largest = len(self.tokenizer) - 1
        if largest >= vocab_size:
            fail(
                f"the tokenizer in {self.directory!r} has ids up to {largest}, over the model's "
                f"vocab_size={vocab_size} ({model_dir!r}): a tokenizer of another model?"
            )

    def encode(self, text: str) -> List[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token ("" for a special token), cached: a byte-level BPE piece of a multi-byte
        character decodes to U+FFFD, which is all step splitting needs."""
        token_id = int(token_id)
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return text
