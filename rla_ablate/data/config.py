"""Typed data configs: one pydantic model per source kind, selected by `kind`, plus `EvalConfig`.

```yaml
data: {kind: stdlib}                                   # the embedded corpus, byte tokens
data: {kind: text, path: corpus/, glob: "**/*.md", tokenizer: tok.json}
data: {kind: jsonl, path: docs.jsonl, text_field: body}   # one JSON object a line, a document each
data: {kind: shards, path: /data/fineweb-50b}          # written by `rla-sweep data prepare`
data: {kind: hf_disk, path: /data/wikitext, split: train, text_column: text}
data: {kind: mqar, vocab_size: 8192, num_kv_pairs: 8}
eval:
  - {name: val, data: {kind: stdlib, split: validation}, tokens: 262144}
  - {name: niah_2k, data: {kind: niah, context_length: 2048}, examples: 200}
```
Paths are resolved against the working directory when the config is built and must exist then.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


def _existing(p: Path | None, what: str) -> Path | None:
    if p is None:
        return None
    resolved = p.expanduser().resolve()
    if not resolved.exists():
        raise ValueError(f"{what} not found: {resolved}")
    return resolved


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Tokenized(_Strict):
    tokenizer: Path | None = None
    """A `tokenizers` JSON file (e.g. a Hugging Face `tokenizer.json`); none = UTF-8 bytes, vocabulary 257."""
    eos_token: str | None = None
    """The token that ends a document; none = the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> found."""

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, v: Path | None) -> Path | None:
        p = _existing(v, "tokenizer file")
        if p is not None and not p.is_file():
            raise ValueError(f"tokenizer must be a JSON file, got a folder: {p}")
        return p

    @field_validator("eos_token")
    @classmethod
    def _eos_needs_tokenizer(cls, v: str | None, info: ValidationInfo) -> str | None:
        # a tokenizer that failed its own check is missing from info.data: that error is the one to report
        if v is not None and "tokenizer" in info.data and info.data["tokenizer"] is None:
            raise ValueError("names a token of a tokenizer file; without one (tokenizer, --tokenizer) the text is "
                             "read as UTF-8 bytes, whose documents end with their own token (256)")
        return v


class StdlibData(_Tokenized):
    """The embedded corpus: Python's standard library docs and sources (about 10.8 MB of text, PSF licence)."""

    kind: Literal["stdlib"] = "stdlib"
    split: Literal["train", "validation"] = "train"
    """Which part; files were assigned to a split by a hash of their path (5% validation)."""


class _Files(_Tokenized):
    """A file, or a folder of files read in sorted path order, split by a hash of each file's path."""

    path: Path
    """A file or a folder."""
    glob: str
    """Which files of a folder to read (pathlib glob, relative to the folder)."""
    split: Literal["all", "train", "validation"] = "all"
    """Hold out files by a hash of their relative path: train, validation, or all files."""
    validation_fraction: float = Field(0.01, gt=0.0, lt=1.0)
    """The share of files that goes to the validation split."""
    _what: ClassVar[str] = "file or folder"

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: Path) -> Path:
        return _existing(v, cls._what)


class TextData(_Files):
    """A UTF-8 text file, or a folder of them (one document per file, in sorted path order)."""

    kind: Literal["text"] = "text"
    glob: str = "**/*.txt"
    _what: ClassVar[str] = "text file or folder"


class JsonlData(_Files):
    """JSON Lines: a file, or a folder of them, of one JSON object a line; the text of each object's `text_field`
    is a document (in file order, files in sorted path order)."""

    kind: Literal["jsonl"] = "jsonl"
    glob: str = "**/*.jsonl"
    text_field: str = "text"
    """The key of each record that holds its text."""
    _what: ClassVar[str] = "JSON Lines file or folder"


class ShardsData(_Strict):
    """Pre-tokenized shards written by `rla-sweep data prepare`, memory-mapped (the format for large runs)."""

    kind: Literal["shards"] = "shards"
    path: Path
    """The folder that holds `index.json` and the shard files."""

    @field_validator("path")
    @classmethod
    def _index_exists(cls, v: Path) -> Path:
        p = _existing(v, "shards folder")
        if p.is_file() and p.name == "index.json":
            p = p.parent
        if p.is_file() and (p.parent / "index.json").is_file():
            raise ValueError(f"{p} is one file of the shards folder {p.parent}; give the folder")
        if p.is_file():  # a text file named as shards: the folder to write is another path
            raise ValueError(f"{p} is a file, not a shards folder; tokenize it with `rla-sweep data prepare {p} OUT` "
                             f"and give OUT here, or read it as it is with kind: text")
        if not (p / "index.json").is_file():
            raise ValueError(f"no index.json in {p}; write shards with `rla-sweep data prepare SRC {p}`")
        return p


class HFDiskData(_Tokenized):
    """A Hugging Face `datasets` dataset saved with `save_to_disk` (no hub access), one document per row."""

    kind: Literal["hf_disk"] = "hf_disk"
    path: Path
    """The folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    split: str | None = None
    """For a DatasetDict: which split (none = its only split, or 'train')."""
    text_column: str = "text"
    """The column that holds the text."""

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: Path) -> Path:
        p = _existing(v, "dataset folder")
        if not p.is_dir():
            raise ValueError(f"a dataset saved with save_to_disk is a folder, got a file: {p}")
        return p


class MQARData(_Strict):
    """Multi-query associative recall (Zoology, Arora et al. 2023): key-value pairs, then queries of the keys.

    Keys come from [1, vocab_size/2), values from [vocab_size/2, vocab_size); every key is queried once, at a
    distance from the context drawn from a power law; only the query positions are scored (the value)."""

    kind: Literal["mqar"] = "mqar"
    vocab_size: int = Field(8192, ge=8)
    """Token vocabulary; half for keys, half for values (Zoology's default 8192)."""
    num_kv_pairs: int = Field(8, ge=1)
    """Key-value pairs per sequence (Zoology varies 4 to 64)."""
    power_a: float = Field(0.01, gt=0.0, le=1.0)
    """Power-law exponent of the query gaps: small = queries close to the context, 1 = uniform."""
    random_non_queries: bool = True
    """Fill the positions between queries with random tokens (else token 0)."""
    seq_len: int | None = Field(None, ge=4)
    """Sequence length; none = the job's."""
    seed: int = 0
    """Fixes the examples of an eval set; a training stream combines it with the job's seed."""

    @model_validator(mode="after")
    def _fits(self) -> MQARData:
        if self.num_kv_pairs > self.vocab_size // 2 - 1:
            raise ValueError(f"num_kv_pairs={self.num_kv_pairs} distinct keys need vocab_size >= "
                             f"{2 * (self.num_kv_pairs + 1)}")
        if self.seq_len is not None and 4 * self.num_kv_pairs > self.seq_len:
            raise ValueError(f"num_kv_pairs={self.num_kv_pairs} needs seq_len >= {4 * self.num_kv_pairs}")
        return self


LMDataConfig = Annotated[StdlibData | TextData | JsonlData | ShardsData | HFDiskData, Field(discriminator="kind")]


class NIAHData(_Strict):
    """Needle in a haystack: 'The secret code for <name> is <value>.' hidden in corpus text at a given depth,
    then cued at the end ('The secret code for <name> is '); only the value's tokens are scored."""

    kind: Literal["niah"] = "niah"
    haystack: LMDataConfig = Field(default_factory=lambda: StdlibData(split="validation"))
    """The filler text (and the tokenizer) as a data config; default: the embedded validation split."""
    context_length: int | None = Field(None, ge=64)
    """Tokens per example; none = the job's sequence length. Use several eval entries for several lengths."""
    depths: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    """Needle positions as a fraction of the filler; example i uses depths[i % len(depths)]."""
    value_digits: int = Field(6, ge=1, le=18)
    """Digits of the secret code (the scored answer)."""
    seed: int = 0
    """Fixes keys, values and filler offsets of an eval set; a training stream combines it with the job's seed."""

    @field_validator("depths")
    @classmethod
    def _nonempty(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("depths needs at least one value in [0, 1]")
        return v


DataConfig = Annotated[StdlibData | TextData | JsonlData | ShardsData | HFDiskData | MQARData | NIAHData,
                       Field(discriminator="kind")]
"""Any data source; YAML picks one with `kind`: stdlib | text | jsonl | shards | hf_disk | mqar | niah."""

RECALL_KINDS = ("mqar", "niah")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]+$")


class EvalConfig(_Strict):
    """One evaluation set: language-modelling loss on held-out text, or recall accuracy on a synthetic task."""

    name: str
    """Short name used in metric keys (`eval/<name>/loss`); letters, digits, _ . @ -."""
    data: DataConfig
    """The data to evaluate on (any kind)."""
    tokens: int = Field(65536, ge=1)
    """Text kinds: how many tokens to score (evenly spaced windows over the whole set)."""
    examples: int = Field(256, ge=1)
    """mqar / niah: how many examples."""

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"eval name {v!r} may only use letters, digits and _ . @ -")
        return v

    @model_validator(mode="after")
    def _right_budget(self) -> EvalConfig:
        recall = self.data.kind in RECALL_KINDS
        # A field left at its default is fine even when written out: model_dump() writes both, and a dumped
        # config must validate again (job.json, Ray workers).
        def changed(name: str) -> bool:
            return name in self.model_fields_set and getattr(self, name) != type(self).model_fields[name].default

        if recall and changed("tokens"):
            raise ValueError(f"a {self.data.kind} eval set counts examples, not tokens; use examples")
        if not recall and changed("examples"):
            raise ValueError(f"a {self.data.kind} eval set counts tokens, not examples; use tokens")
        return self
