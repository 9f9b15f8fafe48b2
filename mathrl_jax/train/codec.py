"""Text <-> token ids with a local Hugging Face tokenizer, as the loop needs them."""

from __future__ import annotations

from typing import Dict, List

from mathrl_jax.train.validation import fail


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
        self._token_texts: Dict[int, str] = {}

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
