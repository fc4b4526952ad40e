"""Token sources: every text-like data config becomes one long token stream, documents ended by EOS.

`open_source(cfg)` returns an object with `len()`, `window(start, stop) -> int64 array`, `vocab_size`, `eos_id`,
`tokenizer` and `fingerprint` (changes whenever the tokens could). Text, JSON Lines, HF-on-disk and the embedded
corpus are tokenized in memory once per process; shards are memory-mapped. `iter_documents` yields the documents of a text
source without tokenizing them, for `data prepare`.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np

from rla_ablate.data.config import HFDiskData, JsonlData, ShardsData, StdlibData, TextData
from rla_ablate.data.shards import ShardReader
from rla_ablate.data.tokenizer import ByteTokenizer, JsonTokenizer, load_tokenizer
from rla_ablate.errors import UserError

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
SNAPSHOT = CORPUS_DIR / "stdlib.jsonl.gz"
MANIFEST = CORPUS_DIR / "stdlib.manifest.json"


def path_fraction(name: str) -> float:
    """A number in [0, 1) that depends only on `name` (the SHA-256 of its UTF-8 bytes)."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@lru_cache(maxsize=1)
def _stdlib_records() -> tuple[tuple[str, str, str], ...]:
    raw = gzip.decompress(SNAPSHOT.read_bytes())
    expected = json.loads(MANIFEST.read_text())["sha256_uncompressed"]
    if hashlib.sha256(raw).hexdigest() != expected:
        raise RuntimeError(f"{SNAPSHOT} is corrupted (SHA-256 differs from {MANIFEST.name}); reinstall rla-sweep")
    return tuple((r["path"], r["split"], r["text"]) for r in map(json.loads, raw.decode("utf-8").splitlines()))


JSON_LINES = (".jsonl", ".ndjson")


def json_lines(path: Path, glob: str | None = None) -> bool:
    """Whether a path given without a kind is JSON Lines: a .jsonl / .ndjson file, a folder read by a `glob` that
    ends so, or a folder whose files are such files and no plain text (.txt) is among them."""
    if path.is_file():
        return path.suffix.lower() in JSON_LINES
    if glob is not None:
        return glob.lower().endswith(JSON_LINES)
    return folder_data(path)["kind"] == "jsonl"


def _suffixes(path: Path) -> Counter[str]:
    """How many files of a folder (at any depth) have each suffix ('' for none)."""
    return Counter(p.suffix.lower() for p in path.rglob("*") if p.is_file())


def _counted(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {suffix + ' ' if suffix else ''}file{'s' if n > 1 else ''}{'' if suffix else ' without a suffix'}"
                     for suffix, n in counts.most_common())


def folder_data(path: Path, how: str = "a data config file (e.g. {kind: jsonl, path: DIR, glob: '**/*.jsonl'})"
                ) -> dict:
    """The data config of a folder named without a kind (`train --data`, `data show`, `data prepare`): its plain text
    (.txt) files, or its JSON Lines files (.jsonl, or .ndjson where it has only those). A folder that holds more than
    one of these kinds is refused, saying `how` to name one: a kind's glob would leave the others unread without a
    word."""
    counts = _suffixes(path)
    kinds = {s: counts[s] for s in (".txt", *JSON_LINES) if counts[s]}
    if len(kinds) > 1:
        raise UserError(f"{path} holds {_counted(Counter(kinds))}, and a folder is read as one kind of file; "
                        f"say which with {how}, or keep one kind in the folder", key="path")
    if ".txt" in kinds or not kinds:
        return {"kind": "text", "path": str(path)}
    return {"kind": "jsonl", "path": str(path)} | ({"glob": "**/*.ndjson"} if ".ndjson" in kinds else {})


def _files_key(cfg: TextData | JsonlData) -> str:
    """The key a problem with one of the files read is said at: path for a file, glob for a folder's files."""
    return "path" if cfg.path.is_file() else "glob"


def _text_files(cfg: TextData | JsonlData) -> list[tuple[str, Path]]:
    if cfg.path.is_file():
        files = [(cfg.path.name, cfg.path)]
    else:
        files = sorted((p.relative_to(cfg.path).as_posix(), p) for p in cfg.path.glob(cfg.glob) if p.is_file())
        if not files:
            counts = _suffixes(cfg.path)
            raise UserError(f"no file under {cfg.path} matches {cfg.glob!r} "
                            + (f"(its files: {_counted(counts)})" if counts else "(it holds no file)"), key="glob")
    records = [p for _, p in files if p.suffix.lower() in JSON_LINES]
    if isinstance(cfg, TextData) and records:  # read whole, its keys and quotes would be the text the model learns
        raise UserError(f"{records[0]} is JSON Lines, which kind text would read as one raw document; read it with "
                        f"kind: jsonl (text_field: the key of each record's text)"
                        + ("" if cfg.path.is_file() else f", or narrow glob (now {cfg.glob}) to the plain text files"),
                        key=_files_key(cfg))
    if cfg.split != "all":
        want_val = cfg.split == "validation"
        files = [(n, p) for n, p in files if (path_fraction(n) < cfg.validation_fraction) == want_val]
        if not files:
            # a larger fraction moves files into validation, a smaller one into train
            how = "raise" if want_val else "lower"
            raise UserError(f"no file of {cfg.path} falls in the {cfg.split} split (validation_fraction="
                            f"{cfg.validation_fraction}, chosen by a hash of each file's path); {how} "
                            "validation_fraction or add files", key="split")
    return files


def _hf_dataset(cfg: HFDiskData):
    try:
        import datasets
    except ImportError:
        raise UserError("kind hf_disk needs the `datasets` package: pip install datasets", key="kind") from None
    try:
        ds = datasets.load_from_disk(str(cfg.path))
    except Exception as exc:
        raise UserError(f"{cfg.path} is not a dataset saved with save_to_disk: {exc}", key="path") from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        split = cfg.split or (names[0] if len(names) == 1 else "train")
        if split not in ds:
            raise UserError(f"split {split!r} is not in {cfg.path}; allowed: {', '.join(names)}", key="split")
        ds = ds[split]
    elif cfg.split is not None:
        raise UserError(f"{cfg.path} is a single Dataset without splits; remove split", key="split")
    if cfg.text_column not in ds.column_names:
        raise UserError(f"column {cfg.text_column!r} is not in {cfg.path}; allowed: {', '.join(ds.column_names)}",
                        key="text_column")
    feature = ds.features[cfg.text_column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        texts = [n for n, f in ds.features.items() if isinstance(f, datasets.Value) and f.dtype in ("string", "large_string")]
        raise UserError(f"column {cfg.text_column!r} of {cfg.path} holds {feature}, not text; allowed: a string column"
                        + (f" ({', '.join(texts)})" if texts else " (this dataset has none)"), key="text_column")
    return ds


def count_documents(cfg: StdlibData | TextData | JsonlData | HFDiskData) -> int:
    if isinstance(cfg, StdlibData):
        return sum(1 for _, split, _ in _stdlib_records() if split == cfg.split)
    if isinstance(cfg, TextData):
        return len(_text_files(cfg))
    if isinstance(cfg, JsonlData):
        return sum(1 for _, p in _text_files(cfg) for _ in _json_lines(p, cfg))
    return len(_hf_dataset(cfg))


def _to_utf8(cfg: TextData | JsonlData) -> str:
    """What to do about a file that is not UTF-8."""
    return ("convert it to UTF-8, or point path at UTF-8 text" if cfg.path.is_file()
            else f"narrow glob (now {cfg.glob}) to the UTF-8 files, or convert this one")


def _utf8(p: Path, cfg: TextData) -> str:
    try:  # a text file keeps its bytes, a byte-order mark included: its token stream stays
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start}); {_to_utf8(cfg)}",
                        key=_files_key(cfg)) from None


def _json_lines(p: Path, cfg: JsonlData) -> Iterator[tuple[int, str]]:
    """(line number, line) of each non-blank line of a JSON Lines file, read a line at a time (a file of any size is
    never held whole). A line ends at a newline alone: JSON text may hold U+2028 and other characters that
    str.splitlines would split a record at. A leading byte-order mark is dropped."""
    with p.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):  # as some editors save it
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{p}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                                f"{_to_utf8(cfg)}", key=_files_key(cfg)) from None
            if line.strip():
                yield number, line


def _records(p: Path, cfg: JsonlData) -> Iterator[str]:
    """The text of each record of one JSON Lines file (blank lines skipped); a line that is not a JSON object, or a
    record without a string at text_field, is named with its line number."""
    for number, line in _json_lines(p, cfg):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}:{number}: not a JSON object ({exc.msg} at column {exc.colno}); JSON Lines holds "
                            "one object a line", key=_files_key(cfg)) from None
        if not isinstance(record, dict):
            raise UserError(f"{p}:{number}: a JSON {type(record).__name__}, not an object with a text_field",
                            key=_files_key(cfg))
        text = record.get(cfg.text_field)
        if not isinstance(text, str):
            keys = [k for k, v in record.items() if isinstance(v, str)]
            kinds = {bool: "true or false", int: "a number", float: "a number", list: "a list", dict: "an object"}
            what = "has no key" if cfg.text_field not in record else f"holds {kinds.get(type(text), 'null')} at"
            raise UserError(f"{p}:{number}: the record {what} {cfg.text_field!r}; its keys with text: "
                            f"{', '.join(map(repr, keys)) or 'none'}", key="text_field")
        yield text


def iter_documents(cfg: StdlibData | TextData | JsonlData | HFDiskData) -> Iterator[str]:
    """The documents of a text-like source, in their fixed order."""
    if isinstance(cfg, StdlibData):
        yield from (text for _, split, text in _stdlib_records() if split == cfg.split)
    elif isinstance(cfg, TextData):
        for _, p in _text_files(cfg):
            yield _utf8(p, cfg)
    elif isinstance(cfg, JsonlData):
        for _, p in _text_files(cfg):
            yield from _records(p, cfg)
    else:
        ds = _hf_dataset(cfg)
        for batch in ds.iter(batch_size=1000):
            for text in batch[cfg.text_column]:
                yield "" if text is None else str(text)


class ArraySource:
    """A token stream held in memory (uint16/uint32 array)."""

    def __init__(self, tokens: np.ndarray, tokenizer, fingerprint: str):
        self.tokens = tokens
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self.fingerprint = fingerprint

    def __len__(self) -> int:
        return int(self.tokens.size)

    def window(self, start: int, stop: int) -> np.ndarray:
        return self.tokens[start:stop].astype(np.int64)


class ShardSource(ShardReader):
    """A memory-mapped shard folder as a token source."""

    def __init__(self, folder: Path):
        super().__init__(folder)
        self.tokenizer = (ByteTokenizer() if self.tokenizer_file is None
                          else JsonTokenizer(self.tokenizer_file, self.eos_token))


def tokenize_documents(docs, tokenizer, batch: int = 256) -> Iterator[np.ndarray]:
    """Token ids of each document (no EOS), encoding `batch` documents at a time."""
    pending: list[str] = []
    for text in docs:
        pending.append(text)
        if len(pending) == batch:
            yield from tokenizer.encode_batch(pending)
            pending = []
    if pending:
        yield from tokenizer.encode_batch(pending)


def _pack(arrays: list[np.ndarray], eos_id: int, vocab_size: int) -> np.ndarray:
    """The documents' tokens, each followed by EOS; an empty document is left out (alone it would add an EOS after
    an EOS, as `data prepare` leaves it out)."""
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    arrays = [a for a in arrays if a.size]
    out = np.empty(sum(a.size + 1 for a in arrays), dtype=dtype)
    pos = 0
    for a in arrays:
        out[pos:pos + a.size] = a
        out[pos + a.size] = eos_id
        pos += a.size + 1
    return out


@lru_cache(maxsize=8)
def _open_cached(key: str, cfg):
    if isinstance(cfg, ShardsData):
        return ShardSource(cfg.path)
    tok = load_tokenizer(cfg.tokenizer, cfg.eos_token)
    if isinstance(tok, ByteTokenizer):
        arrays = [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in iter_documents(cfg)]
    else:
        arrays = list(tokenize_documents(iter_documents(cfg), tok))
    tokens = _pack(arrays, tok.eos_id, tok.vocab_size)
    return ArraySource(tokens, tok, f"{key}:{tok.fingerprint}:{hashlib.sha256(tokens.tobytes()).hexdigest()}")


def open_source(cfg: StdlibData | TextData | JsonlData | ShardsData | HFDiskData):
    """The token stream of a text-like data config (cached per process)."""
    return _open_cached(cfg.model_dump_json(), cfg)
