"""Training streams and eval sets: what the training job calls.

A stream is an endless, resumable iterator of `Batch`es. Sample g of the global order (all ranks together) is a
pure function of (data, seq_len, seed, g): text-like data cuts its token stream into windows of seq_len + 1 tokens
and visits them in a fresh pseudo-random permutation every epoch; recall tasks generate example g. Batch s of
rank r holds samples (s·W + r)·B ... (s·W + r)·B + B - 1, so ranks never overlap and the state is one number.

With `documents=True` every batch also says where documents start (`Batch.doc_starts`): text-like data joins its
documents with EOS, so a document starts at position 0 of each row and right after every EOS in the row; a recall
example is one document. `Batch.cu_seqlens()` turns that into FLA's packed-sequence offsets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rla_ablate.data.config import RECALL_KINDS, EvalConfig, MQARData, NIAHData, ShardsData
from rla_ablate.data.recall import NeedleTask, mqar_examples
from rla_ablate.data.rng import Permutation, derive_key
from rla_ablate.data.shards import read_index
from rla_ablate.data.sources import open_source
from rla_ablate.data.tokenizer import load_tokenizer
from rla_ablate.errors import UserError

if TYPE_CHECKING:
    import torch

STATE_VERSION = 1


@dataclass(frozen=True)
class Batch:
    """`labels[b, t]` is the target of the prediction at `input_ids[b, t]` (already shifted; -100 = not scored)."""

    input_ids: torch.Tensor
    """[B, T] int64."""
    labels: torch.Tensor
    """[B, T] int64."""
    doc_starts: torch.Tensor | None = None
    """[B, T] bool, True where a document starts (always at t = 0); None unless the stream was asked for it."""

    def to(self, device, non_blocking: bool = False) -> Batch:
        return Batch(self.input_ids.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking),
                     None if self.doc_starts is None else self.doc_starts.to(device, non_blocking=non_blocking))

    def cu_seqlens(self) -> torch.Tensor:
        """The documents as FLA's packed sequences: int32 offsets [N + 1] into the batch flattened to one row of
        B·T tokens, from 0 to B·T, including every row's start (a document never runs over two rows)."""
        if self.doc_starts is None:
            raise ValueError("this batch has no document boundaries; make its stream with documents=True")
        return cu_seqlens_from_starts(self.doc_starts)


def cu_seqlens_from_starts(doc_starts_BT: torch.Tensor) -> torch.Tensor:
    """int32 offsets [N + 1] of the documents of a [B, T] start mask, over the batch flattened to B·T tokens."""
    import torch

    starts = doc_starts_BT.clone()
    starts[:, 0] = True
    flat = starts.flatten().nonzero().flatten()
    end = torch.tensor([starts.numel()], dtype=flat.dtype, device=flat.device)
    return torch.cat([flat, end]).to(torch.int32)


def document_starts(inputs: np.ndarray, eos_id: int | None) -> np.ndarray:
    """[B, T] bool: position 0 of every row, and every position right after an EOS (eos_id None: rows only)."""
    starts = np.zeros(inputs.shape, dtype=bool)
    starts[:, 0] = True
    if eos_id is not None:
        starts[:, 1:] = inputs[:, :-1] == eos_id
    return starts


def _batch(inputs: np.ndarray, labels: np.ndarray, starts: np.ndarray | None = None) -> Batch:
    # Imported here so that configs and `vocab_size` (used by `plan`) stay instant to import.
    import torch

    return Batch(torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
                 torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)),
                 None if starts is None else torch.from_numpy(np.ascontiguousarray(starts)))


def vocab_size(cfg) -> int:
    """The smallest model vocabulary that covers every token id this data config produces (reads no corpus)."""
    if isinstance(cfg, MQARData):
        return cfg.vocab_size
    if isinstance(cfg, NIAHData):
        return vocab_size(cfg.haystack)
    if isinstance(cfg, ShardsData):
        return int(read_index(cfg.path)["vocab_size"])
    return load_tokenizer(cfg.tokenizer, cfg.eos_token).vocab_size


def tokenizer_identity(cfg) -> tuple[str, int | None] | None:
    """What turns a text-like data config's text into token ids: ("bytes", None), or ("sha256:<hash>", eos id) of
    its tokenizer file and the token that ends its documents (equal files are one tokenizer wherever they lie; one
    file with another `eos_token` separates documents otherwise); None for MQAR, whose token ids are synthetic."""
    if isinstance(cfg, MQARData):
        return None
    if isinstance(cfg, NIAHData):
        return tokenizer_identity(cfg.haystack)
    if isinstance(cfg, ShardsData):
        index = read_index(cfg.path)
        file = None if index["tokenizer"] == "bytes" else cfg.path / index["tokenizer"]
        eos = None if file is None else int(index["eos_id"])
    else:
        file = cfg.tokenizer
        eos = None if file is None else load_tokenizer(file, cfg.eos_token).eos_id
    return ("bytes", None) if file is None else ("sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()[:16], eos)


def tokenizer_mismatch(train_data, eval_data) -> str | None:
    """Why an eval set cannot score a model trained on `train_data`: its text is tokenized otherwise, so its loss
    and accuracy would compare the model's predictions with token ids it never learned; None when they agree (or
    either side is MQAR)."""
    a, b = tokenizer_identity(train_data), tokenizer_identity(eval_data)
    if a is None or b is None or a == b:
        return None

    def said(identity: tuple[str, int | None], cfg) -> str:
        if identity[0] == "bytes":
            return "UTF-8 bytes"
        where = getattr(cfg, "tokenizer", None) or getattr(getattr(cfg, "haystack", None), "tokenizer", None)
        text = f"the tokenizer {where}" if where else f"the tokenizer of {getattr(cfg, 'path', cfg.kind)}"
        return f"{text} with documents ended by token id {identity[1]}" if a[0] == b[0] else text

    return (f"the eval set's text is tokenized by {said(b, eval_data)}, the training data's by "
            f"{said(a, train_data)}: its scores would compare the model with token ids it never trained on; give "
            "it the training data's tokenizer")


def _recall_len(cfg, seq_len: int) -> int:
    own = cfg.seq_len if isinstance(cfg, MQARData) else cfg.context_length
    return own or seq_len


class _Windows:
    """Windows of seq_len + 1 tokens of a token source: window c is tokens [c·T, c·T + T + 1)."""

    def __init__(self, cfg, seq_len: int):
        self.source = open_source(cfg)
        self.seq_len = seq_len
        self.count = (len(self.source) - 1) // seq_len
        if self.count < 1:
            path = getattr(cfg, "path", None)
            where = f"the data{f' at {path}' if path is not None else ''} ({cfg.kind})"
            if len(self.source) == 0:  # every document empty: nothing is left of them in the stream
                raise UserError(f"{where} holds no text: its documents are empty", key="data")
            raise UserError(f"{where} has {len(self.source)} tokens, fewer than seq_len + 1 = {seq_len + 1}",
                            key="data")

    def rows(self, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        T = self.seq_len
        w = np.stack([self.source.window(int(c) * T, int(c) * T + T + 1) for c in chunks])
        return w[:, :-1], w[:, 1:]


class TrainStream(Iterator[Batch]):
    """Endless batches for one rank; `state_dict()` after k batches resumes at batch k + 1 exactly."""

    def __init__(self, rows: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], fingerprint: str,
                 batch_size: int, rank: int, world_size: int, eos_id: int | None = None, documents: bool = False):
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size (got {batch_size}, {rank}, "
                             f"{world_size})")
        self._rows, self.fingerprint = rows, fingerprint
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.eos_id, self.documents = eos_id, documents
        """The token that ends a document (None: every row is one document); whether batches carry doc_starts."""
        self.samples_seen = 0
        """Samples consumed by all ranks together (global)."""

    def __next__(self) -> Batch:
        first = self.samples_seen + self.rank * self.batch_size
        inputs, labels = self._rows(np.arange(first, first + self.batch_size, dtype=np.int64))
        batch = _batch(inputs, labels, document_starts(inputs, self.eos_id) if self.documents else None)
        self.samples_seen += self.batch_size * self.world_size
        return batch

    def state_dict(self) -> dict:
        """The same on every rank; plain ints and strings (fits `torch.save` with weights_only loading)."""
        return {"version": STATE_VERSION, "samples_seen": self.samples_seen, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise UserError(f"data position from an unknown format version {state.get('version')!r}", key="data")
        if state["fingerprint"] != self.fingerprint:
            raise UserError("the checkpoint was written for different data (source, tokenizer, seq_len or seed "
                            "changed); resume with the original data config or start a new run", key="data")
        self.samples_seen = int(state["samples_seen"])


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def make_train_stream(cfg, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1, documents: bool = False) -> TrainStream:
    """An endless, resumable stream of `Batch`es [batch_size, T] for `rank` of `world_size`.

    T is `seq_len`, except for mqar/niah configs that set their own length. Ranks read disjoint samples.
    `documents`: the batches also carry `doc_starts` (the tokens and the order are the same either way)."""
    if cfg.kind == "mqar":
        T = _recall_len(cfg, seq_len)
        key = derive_key("mqar", "train", seed, cfg.seed)
        return TrainStream(lambda g: mqar_examples(cfg, T, key, g), _fingerprint(cfg.model_dump_json(), T, key),
                           batch_size, rank, world_size, documents=documents)
    if cfg.kind == "niah":
        T = _recall_len(cfg, seq_len)
        task = NeedleTask(cfg, open_source(cfg.haystack), T)
        key = derive_key("niah", "train", seed, cfg.seed)
        return TrainStream(lambda g: task.examples(key, g),
                           _fingerprint(cfg.model_dump_json(), task.source.fingerprint, T, key),
                           batch_size, rank, world_size, documents=documents)
    windows = _Windows(cfg, seq_len)
    perms: dict[int, Permutation] = {}

    def rows(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        epoch, pos = np.divmod(g, windows.count)
        chunks = np.empty_like(g)
        for e in np.unique(epoch):
            if int(e) not in perms:
                perms.clear()
                perms[int(e)] = Permutation(windows.count, derive_key("lm-order", seed, int(e)))
            chunks[epoch == e] = perms[int(e)][pos[epoch == e]]
        return windows.rows(chunks)

    return TrainStream(rows, _fingerprint(windows.source.fingerprint, seq_len, seed), batch_size, rank, world_size,
                       eos_id=windows.source.eos_id, documents=documents)


def make_eval_batches(eval_cfg: EvalConfig, seq_len: int, batch_size: int, documents: bool = False) -> list[Batch]:
    """The fixed batches of an eval set (the last one may be smaller); the same for every job and machine.

    Text-like data: ceil(tokens / seq_len) windows spread evenly over the whole set. mqar / niah: `examples`
    examples from the data config's own seed. `documents`: the batches also carry `doc_starts`."""
    cfg = eval_cfg.data
    eos_id = None
    if cfg.kind in RECALL_KINDS:
        T = _recall_len(cfg, seq_len)
        idx = np.arange(eval_cfg.examples, dtype=np.int64)
        if cfg.kind == "mqar":
            key = derive_key("mqar", "eval", cfg.seed)
            inputs, labels = mqar_examples(cfg, T, key, idx)
        else:
            key = derive_key("niah", "eval", cfg.seed)
            inputs, labels = NeedleTask(cfg, open_source(cfg.haystack), T).examples(key, idx)
    else:
        windows = _Windows(cfg, seq_len)
        eos_id = windows.source.eos_id
        count = min(windows.count, -(-eval_cfg.tokens // seq_len))
        inputs, labels = windows.rows((np.arange(count, dtype=np.int64) * windows.count) // count)
    starts = document_starts(inputs, eos_id) if documents else None
    return [_batch(inputs[i:i + batch_size], labels[i:i + batch_size],
                   None if starts is None else starts[i:i + batch_size])
            for i in range(0, len(inputs), batch_size)]
