"""Tokenizers: raw UTF-8 bytes (the default, nothing to download) or any `tokenizers` JSON file.

Both encode text to token ids and mark document ends with an end-of-sequence id (`eos_id`); `vocab_size`
is the smallest embedding size a model needs for them.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from rla_ablate.errors import UserError

# Tried in this order when a tokenizer config does not name its end-of-document token.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")


class ByteTokenizer:
    """Token i < 256 is the byte i of the UTF-8 text; 256 ends a document."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256
    fingerprint = "bytes"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from its `tokenizer.json`; special tokens are not added."""

    def __init__(self, path: Path, eos_token: str | None = None, key: str = "tokenizer"):
        from tokenizers import Tokenizer

        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"tokenizer file not found: {self.path}", key=key)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as exc:
            raise UserError(f"cannot load tokenizer {self.path}: {exc}", key=key) from None
        self.name = self.path.name
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        candidates = (eos_token,) if eos_token else EOS_CANDIDATES
        ids = [(t, self._tok.token_to_id(t)) for t in candidates]
        found = [(t, i) for t, i in ids if i is not None]
        if not found:
            if eos_token:
                raise UserError(f"token {eos_token!r} is not in the vocabulary of {self.path}", key="eos_token")
            raise UserError(f"{self.path} has none of the usual end-of-document tokens "
                            f"({', '.join(EOS_CANDIDATES)}); name one of its tokens here", key="eos_token")
        self.eos_token, self.eos_id = found[0]
        self.vocab_size = max(self.vocab_size, self.eos_id + 1)
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        self.fingerprint = f"tokenizers:{digest}:{self.eos_token}"

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


@lru_cache(maxsize=8)
def _load_json(path: str, eos_token: str | None, mtime_ns: int) -> JsonTokenizer:
    return JsonTokenizer(Path(path), eos_token)


def load_tokenizer(path: str | Path | None, eos_token: str | None = None) -> ByteTokenizer | JsonTokenizer:
    """The byte tokenizer for `path=None`, else the `tokenizers` JSON at `path` (cached per process)."""
    if path is None:
        return ByteTokenizer()
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"tokenizer file not found: {p}", key="tokenizer")
    return _load_json(str(p.resolve()), eos_token, p.stat().st_mtime_ns)
