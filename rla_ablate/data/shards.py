"""Pre-tokenized shards: raw little-endian uint16/uint32 token files plus a small `index.json`.

```
OUT/index.json                {"format": "rla-sweep-shards", "version": 1, "dtype": "uint16", "vocab_size": ...,
                               "eos_id": ..., "tokenizer": "bytes" | "tokenizer.json", "tokens": ..., "documents": ...,
                               "shards": [{"file": "tokens-00000.bin", "tokens": ...}, ...]}
OUT/tokens-00000.bin ...      the token stream, documents separated by eos_id, split at arbitrary points
OUT/tokenizer.json            a copy of the tokenizer (absent for byte tokens), so the folder is self-contained
```
Readers memory-map the files, so a 50B-token corpus costs no RAM and any window is an O(1) slice. The index is
written last (temp file + rename): a folder without it is an interrupted write, never a short corpus.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from rla_ablate.errors import UserError
from rla_ablate.fileio import atomic_write_text

FORMAT = "rla-sweep-shards"
VERSION = 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
DEFAULT_SHARD_TOKENS = 1 << 28


def choose_dtype(vocab_size: int, requested: str | None) -> str:
    """uint16 when every id fits (vocabulary <= 65536), else uint32; a too-small request is a UserError."""
    if requested is None:
        return "uint16" if vocab_size <= 1 << 16 else "uint32"
    if requested not in DTYPES:
        raise UserError(f"dtype {requested!r} is not allowed; allowed: uint16, uint32", key="--dtype")
    if requested == "uint16" and vocab_size > 1 << 16:
        raise UserError(f"the tokenizer has {vocab_size} tokens, more than uint16 holds; use uint32", key="--dtype")
    return requested


class ShardWriter:
    """Appends token arrays (one document each, EOS added) and cuts shard files of `shard_tokens` tokens."""

    def __init__(self, out: Path, *, dtype: str, vocab_size: int, eos_id: int, tokenizer_file: Path | None,
                 eos_token: str | None, shard_tokens: int = DEFAULT_SHARD_TOKENS, source: str = "",
                 source_split: str | None = None):
        self.out = Path(out)
        if (self.out / "index.json").exists():
            raise UserError(f"{self.out} already holds shards (index.json); choose a new folder", key="OUT")
        self.out.mkdir(parents=True, exist_ok=True)
        self.dtype = DTYPES[dtype]
        self.meta = {"format": FORMAT, "version": VERSION, "dtype": dtype, "byteorder": "little",
                     "vocab_size": vocab_size, "eos_id": eos_id, "tokenizer": "bytes", "eos_token": eos_token,
                     "source": source}
        if source_split is not None:  # which split of its source the folder holds (the embedded corpus' or a dataset's)
            self.meta["source_split"] = source_split
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, self.out / "tokenizer.json")
            self.meta["tokenizer"] = "tokenizer.json"
        self.shard_tokens = shard_tokens
        self.shards: list[dict] = []
        self.documents = 0
        self._eos = np.array([eos_id], dtype=self.dtype)
        self._file = None
        self._in_file = 0

    def _open_next(self) -> None:
        name = f"tokens-{len(self.shards):05d}.bin"
        self._file = open(self.out / name, "wb")
        self.shards.append({"file": name, "tokens": 0})
        self._in_file = 0

    def _write(self, arr: np.ndarray) -> None:
        while arr.size:
            if self._file is None or self._in_file == self.shard_tokens:
                if self._file is not None:
                    self._file.close()
                self._open_next()
            take = min(arr.size, self.shard_tokens - self._in_file)
            self._file.write(arr[:take].tobytes())
            self._in_file += take
            self.shards[-1]["tokens"] += take
            arr = arr[take:]

    def add(self, ids: np.ndarray) -> None:
        self._write(np.asarray(ids).astype(self.dtype, copy=False))
        self._write(self._eos)
        self.documents += 1

    def close(self) -> dict:
        if self._file is not None:
            self._file.close()
        index = dict(self.meta, tokens=sum(s["tokens"] for s in self.shards), documents=self.documents,
                     shards=self.shards)
        atomic_write_text(self.out / "index.json", json.dumps(index, indent=1) + "\n")
        return index


INDEX_KEYS = ("dtype", "vocab_size", "eos_id", "tokenizer", "shards")


def read_index(folder: Path, key: str = "path") -> dict:
    """A shard folder's index.json, checked: this format and version, with every key a reader takes
    (`INDEX_KEYS`); a UserError naming the file (at `key`) otherwise."""
    index_path = Path(folder) / "index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {index_path}: {exc}", key=key) from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise UserError(f"{index_path} is not a {FORMAT} v{VERSION} index; write the folder with `rla-sweep data "
                        "prepare`", key=key)
    what = _index_problem(index)
    if what:
        raise UserError(f"{index_path} {what}; write the folder again with `rla-sweep data prepare`", key=key)
    return index


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _index_problem(index: dict) -> str:
    """What is wrong with an index of this format and version ("" when nothing): a key a reader takes missing, or a
    value no `data prepare` writes."""
    missing = [k for k in INDEX_KEYS if k not in index]
    if missing:
        return f"lacks {', '.join(missing)}"
    if index["dtype"] not in DTYPES:
        return f"names dtype {index['dtype']!r}"
    if not _count(index["vocab_size"]) or not index["vocab_size"]:
        return f"has vocab_size {index['vocab_size']!r}"
    if not _count(index["eos_id"]) or index["eos_id"] >= index["vocab_size"]:
        return f"has eos_id {index['eos_id']!r} outside its vocabulary"
    shards = index["shards"]
    if not isinstance(shards, list) or not all(
            isinstance(e, dict) and isinstance(e.get("file"), str) and Path(e["file"]).name == e["file"]
            and _count(e.get("tokens")) for e in shards):
        return "has a shard list that is not one {file, tokens} a shard file of the folder"
    if "tokens" in index and not _count(index["tokens"]):
        return f"has tokens {index['tokens']!r}"
    return ""


class ShardReader:
    """The token stream of a shard folder, memory-mapped; `window(a, b)` may span shard boundaries."""

    def __init__(self, folder: Path, key: str = "path"):
        self.folder = Path(folder)
        index = self.index = read_index(self.folder, key)
        dtype = DTYPES[index["dtype"]]
        self._maps = []
        for shard in index["shards"]:
            f = self.folder / shard["file"]
            expected = shard["tokens"] * dtype.itemsize
            if not f.is_file() or f.stat().st_size != expected:
                got = f.stat().st_size if f.is_file() else "missing"
                raise UserError(f"shard {f} should hold {expected} bytes, found {got}; rewrite the folder "
                                "with `rla-sweep data prepare`", key=key)
            if shard["tokens"]:
                self._maps.append(np.memmap(f, dtype=dtype, mode="r"))
        self._starts = np.cumsum([0] + [m.size for m in self._maps])
        self.vocab_size = int(index["vocab_size"])
        self.eos_id = int(index["eos_id"])
        self.tokenizer_file = None if index["tokenizer"] == "bytes" else self.folder / index["tokenizer"]
        self.eos_token = index.get("eos_token")
        digest = hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()
        self.fingerprint = f"shards:{digest}"

    def __len__(self) -> int:
        return int(self._starts[-1])

    def window(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the whole stream as int64."""
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts = []
        while start < stop:
            m = self._maps[first]
            lo = start - int(self._starts[first])
            hi = min(m.size, lo + stop - start)
            parts.append(np.asarray(m[lo:hi]))
            start += hi - lo
            first += 1
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

