"""`TrainConfig`: the optimizer, schedule, budget and bookkeeping of one training job.

Defaults follow the paper (Lai et al., App. C): AdamW, cosine from 3e-4 to 3e-5, 0.5B warmup tokens,
4M-token batches (2**22, so it splits into whole micro batches), weight decay 0.1, gradient clipping 1.0,
a 50B-token budget. Choices the paper leaves open are documented on their fields.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_serializer, model_validator

from rla_ablate.config.numbers import MAX_SEED, NumbersNotBools

PAPER_BATCH_TOKENS = 2**22
# Fields added after job ids were first recorded, with the value every earlier job meant: the dump leaves them out
# at that value, so configs that do not use them keep their job ids (and the golden job its own).
_LATER_FIELDS = {"reset_state_at_documents": False, "cuda_graphs": False}


class TrainConfig(NumbersNotBools):
    """How one model is trained: budget, optimizer, schedule, precision, logging and checkpoints."""

    model_config = ConfigDict(extra="forbid")

    tokens: int = Field(50_000_000_000, gt=0)
    """Token budget: training stops once this many tokens have been seen (paper: 50B). Rounded up to whole steps."""
    seq_len: int = Field(2048, gt=0)
    """Tokens per training sequence (the paper does not state its context length; 2048 as in FLA's 1.3B runs)."""
    micro_batch_size: int = Field(8, gt=0)
    """Sequences per forward/backward pass on one worker; gradients accumulate up to `batch_tokens`."""
    batch_tokens: int = Field(PAPER_BATCH_TOKENS, gt=0)
    """Tokens per optimizer step over all workers (paper: 4M). Must be a multiple of
    micro_batch_size * seq_len * num_workers."""

    lr: float = Field(3e-4, gt=0)
    """Peak learning rate, reached at the end of warmup (paper: 3e-4)."""
    min_lr: float = Field(3e-5, ge=0)
    """Learning rate at the end of the cosine decay (paper: 3e-5)."""
    warmup_tokens: int | None = Field(None, ge=0)
    """Tokens of linear warmup from 0 to `lr`. null: 1% of the budget, which is the paper's 0.5B at 50B tokens."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW decoupled weight decay, applied to weights of two or more dimensions (linear, embedding, short
    conv), never to biases, norm scales or gate vectors (the nanoGPT convention; the paper does not say)."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    """AdamW beta2 (0.95, the usual value for LM pretraining; the paper does not say)."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient L2 norm to this value (paper: 1.0); null disables clipping."""

    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on CUDA, fp32 on CPU. bf16 keeps fp32 master weights and optimizer state."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: auto picks CUDA when available."""
    cpu_threads: int | None = Field(None, gt=0)
    """torch intra-op threads on CPU. Fix it for bit-reproducible CPU runs; null keeps torch's default."""

    eval_every_tokens: int | None = Field(None, gt=0)
    """Evaluate every eval set each time this many tokens have passed, and at the end. null: 10 times per run."""
    log_every_tokens: int | None = Field(None, gt=0)
    """Log training metrics (means over the steps since the last log) at this interval. null: every step."""
    checkpoint_every_tokens: int | None = Field(None, gt=0)
    """Write a checkpoint at this interval and at the end. null: 10 times per run."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the newest checkpoints to keep on disk."""
    stats_every_tokens: int | None = Field(None, gt=0)
    """Log per-layer norms (Fig. 4a) and mechanism diagnostics, from one eval batch, at this interval. null: at
    every eval."""

    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed for initialization, data order and every random number generator (0 to 2^63 - 1: what torch, numpy and
    Python all take)."""

    reset_state_at_documents: bool = False
    """Start every document from a zero state: the batch runs as packed sequences (FLA's cu_seqlens, from where
    the data's EOS falls), so no recurrent state, short-conv input or attention crosses a document boundary, in
    training and evaluation forwards alike. false: windows are cut from the joined token stream and the state runs
    on across documents (the paper's runs and every earlier job)."""

    max_skipped_steps: int = Field(10, ge=0)
    """Steps with a NaN/Inf loss or gradient are skipped; one more than this fails the job as diverged."""
    spike_zscore: float | None = Field(6.0, gt=0)
    """A step whose loss lies this many standard deviations above the running mean is logged as a loss_spike
    event (running mean and variance: EMA, decay 0.99, after 20 steps). null disables spike detection."""

    peak_flops: float | None = Field(None, gt=0)
    """Device peak FLOP/s per worker for MFU. null: looked up for known GPUs (bf16 dense); MFU is not logged
    when unknown (e.g. on CPU)."""

    cuda_graphs: bool = False
    """Capture a micro batch's forward and backward in a CUDA graph after the first steps of each process and replay
    it for every later micro batch: one launch instead of every kernel, for models whose step waits for the host
    (100M and below on a fast GPU). The clip, the divergence guard and AdamW stay eager; the numbers are the eager
    step's (rla_ablate/train/graphs.py). Needs CUDA, one worker and no packed documents."""

    num_workers: int = Field(1, ge=1)
    """Data-parallel workers (one per GPU) through Ray Train's TorchTrainer; 1 runs in the calling process."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state across workers (FSDP2, one unit per block) instead of
    replicating them (DDP). Meant for the 1.5B shape; needs num_workers > 1."""

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.batch_tokens > self.tokens:
            raise ValueError(f"batch_tokens ({self.batch_tokens}) exceeds the token budget tokens ({self.tokens}); "
                             "lower batch_tokens (with micro_batch_size and seq_len) or raise tokens")
        if self.warmup_tokens is not None and self.warmup_tokens >= self.tokens:
            raise ValueError(f"warmup_tokens ({self.warmup_tokens}) must be below the token budget ({self.tokens}); "
                             "leave it unset for 1% of the budget")
        per_pass = self.micro_batch_size * self.seq_len * self.num_workers
        if self.batch_tokens % per_pass:
            raise ValueError(
                f"batch_tokens ({self.batch_tokens}) must be a multiple of micro_batch_size * seq_len * num_workers"
                f" = {self.micro_batch_size} * {self.seq_len} * {self.num_workers} = {per_pass}"
            )
        if self.fsdp and self.num_workers < 2:
            raise ValueError("fsdp needs num_workers >= 2")
        if self.cuda_graphs:
            for bad, why in ((self.device == "cpu", "device cpu: CUDA graphs need a CUDA device"),
                             (self.reset_state_at_documents, "reset_state_at_documents: packed documents change "
                              "the kernels' shapes and read offsets on the host every batch"),
                             (self.num_workers > 1, f"num_workers {self.num_workers}: data-parallel workers "
                              "synchronise gradients with hooks a graph does not replay")):
                if bad:
                    raise ValueError(f"cuda_graphs cannot run with {why}; set cuda_graphs false")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        data = handler(self)
        for key, default in _LATER_FIELDS.items():
            if data.get(key) == default:
                data.pop(key)
        return data

    @property
    def needs_cuda(self) -> bool:
        """The job cannot run without CUDA: device cuda, or CUDA graphs."""
        return self.device == "cuda" or self.cuda_graphs

    @property
    def micro_batches_per_step(self) -> int:
        """Gradient accumulation steps on each worker."""
        return self.batch_tokens // (self.micro_batch_size * self.seq_len * self.num_workers)

    @property
    def total_steps(self) -> int:
        """Optimizer steps: the budget rounded up to whole batches."""
        return math.ceil(self.tokens / self.batch_tokens)

    @property
    def total_tokens(self) -> int:
        """Tokens the job actually trains on (the budget rounded up to whole batches)."""
        return self.total_steps * self.batch_tokens

    @property
    def resolved_warmup_tokens(self) -> int:
        return self.warmup_tokens if self.warmup_tokens is not None else self.tokens // 100

    def every_steps(self, tokens: int | None, default_times: int | None) -> int:
        """An interval in tokens turned into whole optimizer steps (at least one)."""
        if tokens is None:
            if default_times is None:
                return 1
            return max(1, math.ceil(self.total_steps / default_times))
        return max(1, math.ceil(tokens / self.batch_tokens))

    @property
    def eval_every_steps(self) -> int:
        return self.every_steps(self.eval_every_tokens, 10)

    @property
    def log_every_steps(self) -> int:
        return self.every_steps(self.log_every_tokens, None)

    @property
    def checkpoint_every_steps(self) -> int:
        return self.every_steps(self.checkpoint_every_tokens, 10)

    @property
    def stats_every_steps(self) -> int:
        if self.stats_every_tokens is None:
            return self.eval_every_steps
        return self.every_steps(self.stats_every_tokens, None)
