"""Data for training and evaluation: text, pre-tokenized shards, HF datasets on disk, the embedded corpus, and
synthetic recall (MQAR, needle in a haystack). No downloads at run time.

The training job needs four names:

    stream = make_train_stream(job.data, seq_len, batch_size, seed, rank, world_size)
    batch = next(stream)                      # Batch(input_ids [B, T] int64, labels [B, T] int64, -100 = skip)
    ckpt["data"] = stream.state_dict(); stream.load_state_dict(ckpt["data"])
    evals = {e.name: make_eval_batches(e, seq_len, batch_size) for e in job.eval}
    vocab_size(job.data)                      # the smallest model vocabulary that fits
    make_train_stream(..., documents=True)    # batches also carry doc_starts [B, T]; batch.cu_seqlens() for FLA

Labels are already shifted: loss = cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100);
recall accuracy = (logits.argmax(-1) == labels)[labels != -100].float().mean().
"""

from rla_ablate.data.config import (
    DataConfig,
    EvalConfig,
    HFDiskData,
    JsonlData,
    LMDataConfig,
    MQARData,
    NIAHData,
    ShardsData,
    StdlibData,
    TextData,
)
from rla_ablate.data.stream import (
    Batch,
    TrainStream,
    cu_seqlens_from_starts,
    make_eval_batches,
    make_train_stream,
    tokenizer_mismatch,
    vocab_size,
)

__all__ = [
    "Batch",
    "DataConfig",
    "EvalConfig",
    "HFDiskData",
    "JsonlData",
    "LMDataConfig",
    "MQARData",
    "NIAHData",
    "ShardsData",
    "StdlibData",
    "TextData",
    "TrainStream",
    "cu_seqlens_from_starts",
    "make_eval_batches",
    "make_train_stream",
    "tokenizer_mismatch",
    "vocab_size",
]
