"""`train_worker`: one worker's training run on a token budget: evaluate, log, checkpoint, resume, guard against
divergence (the whole job when it runs alone; `run_job` in rla_ablate.train.run picks one process or Ray Train).

One optimizer step consumes `batch_tokens` tokens: `micro_batches_per_step` forward/backward passes of
`micro_batch_size` sequences on each of `num_workers` workers. The loss of a step is the mean over every
scored token of the whole batch (all workers), whatever the split into micro batches, so a single process
and N data-parallel workers compute the same update. The step of every metric is tokens seen.
"""

from __future__ import annotations

import contextlib
import math
import random
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from rla_ablate import __version__
from rla_ablate.data import make_eval_batches, make_train_stream, tokenizer_mismatch, vocab_size
from rla_ablate.data.stream import Batch
from rla_ablate.errors import UserError, keys_under
from rla_ablate.models import aggregate_diagnostics, build_model, flops_per_token, fusion
from rla_ablate.outcome import Status
from rla_ablate.train.checkpoint import capture_rng, load_latest, restore_rng, save_checkpoint
from rla_ablate.train.graphs import WARMUP_STEPS, GraphedMicroStep, peak_memory_bytes
from rla_ablate.train.guard import DivergenceGuard
from rla_ablate.train.job import JobConfig, JobResult, another_job
from rla_ablate.train import local_memory
from rla_ablate.train.local_memory import LocalMemory, TuningGate
from rla_ablate.train.loggers import (CompositeLogger, JSONLLogger, MetricLogger, NullLogger, read_jsonl,
                                     truncate_jsonl)
from rla_ablate.train.parallel import WorkerContext, make_parallel
from rla_ablate.train.schedule import lr_at

if TYPE_CHECKING:
    from rla_ablate.models.model import CausalLM

IGNORE_INDEX = fusion.IGNORE_INDEX

# Dense bf16 peak FLOP/s per device, for MFU when `peak_flops` is not set (vendor datasheets). The first
# name contained in torch's device name wins, so the PCIe part comes before the SXM one.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12}


def check_job(job: JobConfig) -> None:
    """What can be checked before anything is built: the model's vocabulary covers every token of the data, and
    each eval set's text is tokenized as the training data's."""
    sources = [("the training data", job.data)] + [(f"eval set '{e.name}'", e.data) for e in job.eval]
    need, who, cfg = max(((vocab_size(c), w, c) for w, c in sources), key=lambda t: t[0])
    if need > job.model.vocab_size:
        raise UserError(f"the model's vocab_size is {job.model.vocab_size} but {who} ({cfg.kind}) needs {need} token "
                        f"ids; set model.vocab_size={need} (--set model.vocab_size={need})", key="model.vocab_size")
    for i, e in enumerate(job.eval):
        if why := tokenizer_mismatch(job.data, e.data):
            raise UserError(f"eval set '{e.name}': {why}", key=f"eval.{i}.data")


def check_device(train: Any) -> None:
    """A UserError where the job asks for CUDA and this process has none (the `train` command checks before it
    makes the job's folder, a job before it builds anything)."""
    if torch.cuda.is_available():
        return
    if train.device == "cuda":
        raise UserError("device cuda asked for but CUDA is not available here; allowed here: auto or cpu",
                        key="train.device")
    if train.cuda_graphs:
        raise UserError("cuda_graphs asked for but CUDA is not available here; allowed here: false",
                        key="train.cuda_graphs")


def _resolve_device(job: JobConfig, ctx: WorkerContext) -> torch.device:
    if ctx.device is not None:
        return ctx.device
    check_device(job.train)
    want = job.train.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _uses_bf16(device: torch.device, precision: str) -> bool:
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def _autocast(device: torch.device, precision: str):
    if _uses_bf16(device, precision):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _peak_flops(job: JobConfig, device: torch.device) -> float | None:
    if job.train.peak_flops is not None:
        return job.train.peak_flops
    if device.type != "cuda" or not _uses_bf16(device, job.train.precision):
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_FLOPS.items():
        if key in name:
            return value
    return None


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _LogWindow:
    """Sums since the last train log; part of the checkpoint so a resumed run logs the same means."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss_sum, self.grad_norm_sum, self.steps = 0.0, 0.0, 0
        self.seconds, self.tokens = 0.0, 0

    def add(self, loss: float, grad_norm: float) -> None:
        self.loss_sum += loss
        self.grad_norm_sum += grad_norm
        self.steps += 1

    def state_dict(self) -> dict:
        return {"loss_sum": self.loss_sum, "grad_norm_sum": self.grad_norm_sum, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.loss_sum, self.grad_norm_sum = float(state["loss_sum"]), float(state["grad_norm_sum"])
        self.steps = int(state["steps"])


class _Curves:
    """The area under each eval set's accuracy curve so far, over the tokens trained: at an evaluation at t tokens,
    `eval/<set>/acc_area` = sum_i acc_i (t_i - t_(i-1)) / t over the evaluations so far (t_0 = 0; each value stands
    for the tokens since the one before). It is the mean accuracy over training: 1 for a model right from the start,
    low for one that learned late or never, where the final accuracy of both can be 1. Part of the checkpoint, so a
    resumed run logs the uninterrupted run's values; for a checkpoint written without it, `rebuild` sums the
    evaluations in the job's metrics.jsonl, and where they are not all there the run logs no area rather than one
    that misses some."""

    def __init__(self):
        self.area: dict[str, float] = {}
        self.tokens = 0
        self.known = True

    def add(self, evals: dict[str, float], tokens: int) -> dict[str, float]:
        if not self.known or tokens <= self.tokens:
            return {}
        span, out = tokens - self.tokens, {}
        for key, value in evals.items():
            if _is_acc(key):
                self.area[key] = self.area.get(key, 0.0) + value * span
                out[f"{key}_area"] = self.area[key] / tokens
        self.tokens = tokens
        return out

    def state_dict(self) -> dict:
        return {"area": dict(self.area), "tokens": self.tokens, "known": self.known}

    def load_state_dict(self, state: dict) -> None:
        self.area = {k: float(v) for k, v in state["area"].items()}
        self.tokens = int(state["tokens"])
        self.known = bool(state.get("known", True))  # unknown stays unknown through every later resume

    def rebuild(self, records: list[dict], tokens: int, metrics: dict[str, float]) -> None:
        """The state at `tokens` from a job's logged evaluations (metrics.jsonl `records`). Where the records
        lack an eval set that `metrics` (the checkpoint's last values) has, or its sets end at different tokens, the
        area is unknown and `metrics` lose their areas. An evaluation missing between two logged ones (a log edited
        by hand) is not detected: the log is appended to and cut back only to a checkpoint."""
        by_step: dict[int, dict[str, float]] = {}
        for r in records:
            if r.get("type") == "metrics" and int(r["step"]) <= tokens:
                for key, value in r["values"].items():
                    if _is_acc(key):
                        by_step.setdefault(int(r["step"]), {})[key] = float(value)
        for step in sorted(by_step):  # each logged evaluation again, as the run made them
            self.add(by_step[step], step)
        sets = {key for values in by_step.values() for key in values}
        last = {key for key in metrics if _is_acc(key)}
        if not last <= sets or (by_step and by_step[max(by_step)].keys() != sets):
            self.known = False
            for key in [k for k in metrics if k.startswith("eval/") and k.endswith("/acc_area")]:
                del metrics[key]


def _is_acc(key: str) -> bool:
    """An eval set's accuracy (eval/<set>/acc), whose curve `_Curves` sums."""
    return key.startswith("eval/") and key.endswith("/acc")


class Trainer:
    """The state of one worker's training run; `run()` returns the JobResult."""

    def __init__(self, job: JobConfig, out_dir: Path, logger: MetricLogger | None, ctx: WorkerContext,
                 should_stop: Callable[[], bool] | None, shares_gpu: bool = False):
        self.job, self.cfg, self.out_dir, self.ctx = job, job.train, Path(out_dir), ctx
        self.should_stop = should_stop
        self.shares_gpu = shares_gpu
        # packed on a GPU with other jobs: the steps that may autotune go through the GPU's gate (setup builds it)
        self.gate: TuningGate | None = None
        self.gates_autotuning = False  # the gate is taken where Triton autotunes, not through the first steps
        self.on_progress: Callable[[int], None] | None = None
        self.user_logger = logger
        self.logger: MetricLogger = NullLogger()
        self.jsonl: JSONLLogger | None = None
        self.metrics: dict[str, float] = {}
        self.step = 0
        self.tokens = 0
        self.window = _LogWindow()
        self.curves = _Curves()
        self.pending_state: dict | None = None
        # The last training micro batch: the stats forward's input when the job has no eval batches.
        self.last_batch: Batch | None = None
        # Built by setup(), which needs the device and the checkpoint folder: the model (raw, and wrapped by its
        # parallelism), the optimizer, the training stream and eval batches, the divergence guard, FLOP counts.
        self.device: torch.device
        self.raw_model: CausalLM
        self.parallel: Any
        self.model: torch.nn.Module
        self.optimizer: torch.optim.Optimizer
        self.stream: Any
        self.evals: dict[str, Any]
        self.guard: DivergenceGuard
        self.flops_per_token: float
        self.peak_flops: float | None
        # The micro batches' forward and backward in a CUDA graph (train.cuda_graphs), else None: eager.
        self.graphs: GraphedMicroStep | None = None
        self.skipped_checkpoints: list[str] = []

    def stateful(self) -> dict[str, Any]:
        """The components a checkpoint holds besides the model, the optimizer and the RNGs, by checkpoint key:
        `save` and `restore` both iterate this one table."""
        return {"data": self.stream, "guard": self.guard, "log_window": self.window, "curves": self.curves}

    def setup(self) -> dict | None:
        """Build everything; returns the checkpoint state a resume starts from, if any."""
        cfg, job = self.cfg, self.job
        if cfg.cpu_threads is not None:
            torch.set_num_threads(cfg.cpu_threads)
        self.device = _resolve_device(job, self.ctx)
        check_job(job)

        _seed_everything(cfg.seed)
        model = build_model(job.model).to(self.device)
        self.raw_model = model
        self.parallel = make_parallel(self.ctx, self.device, fsdp=cfg.fsdp,
                                      bf16=_uses_bf16(self.device, cfg.precision))
        self.model = self.parallel.wrap(model)
        self.optimizer = torch.optim.AdamW(
            _param_groups(self.raw_model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps, **({"fused": True} if self.device.type == "cuda" else {}),
        )
        docs = cfg.reset_state_at_documents
        with keys_under("data"):
            self.stream = make_train_stream(job.data, cfg.seq_len, cfg.micro_batch_size, cfg.seed,
                                            self.ctx.rank, self.ctx.world_size, documents=docs)
        self.evals = {}
        for i, e in enumerate(job.eval):
            with keys_under(f"eval.{i}.data"):
                self.evals[e.name] = make_eval_batches(e, cfg.seq_len, cfg.micro_batch_size, documents=docs)
        self.guard = DivergenceGuard(cfg.max_skipped_steps, cfg.spike_zscore)
        self.flops_per_token = flops_per_token(job.model, cfg.seq_len)
        self.peak_flops = _peak_flops(job, self.device)
        self.local_memory = LocalMemory(self.device)
        if self.shares_gpu:
            self.gate = TuningGate(self.device, self._stop_requested)
            self.gates_autotuning = local_memory.gates_autotuning(self.device, self.gate, on_wait=self._say_gate_wait)
        if cfg.cuda_graphs:
            # The micro step the graph records is the eager one: autocast is entered inside the recording, so its
            # cast cache ends there too and every replay casts the weights the last step updated.
            self.graphs = GraphedMicroStep(lambda ids, labels: self._forward_loss(Batch(ids, labels)), self.device,
                                           on_capture=lambda detail: self.logger.event("info", self.tokens, detail))

        # Unreadable newer checkpoints (a torn disk, a bad copy) are skipped; the resumed event names them.
        self.skipped_checkpoints = []
        found = load_latest(self.out_dir, skipped=self.skipped_checkpoints)
        if found is None:
            return None
        path, state = found
        if state["job"] != job.identity_json():
            raise UserError(f"{path} was written by {another_job(job.identity_json(), state['job'])}", key="out")
        return state

    def open_logs(self, resume_tokens: int | None) -> None:
        metrics_path = self.out_dir / "metrics.jsonl"
        if self.ctx.rank != 0:
            return
        # Records past the checkpoint were written by the attempt that died; the resumed run rewrites them.
        truncate_jsonl(metrics_path, -1 if resume_tokens is None else resume_tokens)
        self.jsonl = JSONLLogger(metrics_path)
        self.logger = CompositeLogger(self.jsonl, self.user_logger) if self.user_logger else self.jsonl
        # a logger may also take the tokens after every step (`tokens_trained`): a sweep's live rate and ETA between
        # metric logs
        hook = getattr(self.user_logger, "tokens_trained", None)
        self.on_progress = hook if callable(hook) else None

    def save(self, finished: bool = False) -> None:
        model_state = self.parallel.state_dict(self.raw_model, self.optimizer)
        rngs = self.parallel.gather(capture_rng())
        if self.ctx.rank == 0:
            state = {
                "job": self.job.identity_json(),
                "step": self.step,
                "world_size": self.ctx.world_size,
                **model_state,
                **{key: part.state_dict() for key, part in self.stateful().items()},
                "rng": rngs,
                "metrics": dict(self.metrics),
                "finished": finished,
            }
            path = save_checkpoint(self.out_dir, self.tokens, state, self.cfg.keep_checkpoints)
            self.logger.event("checkpoint", self.tokens, {"path": path.name, "finished": finished})
        self.parallel.barrier()

    def restore(self, state: dict) -> None:
        if int(state["world_size"]) != self.ctx.world_size:
            raise UserError(f"the checkpoint was written by {state['world_size']} workers, this job has "
                            f"{self.ctx.world_size}; resume with the same train.num_workers", key="train.num_workers")
        self.parallel.load_state_dict(self.raw_model, self.optimizer, state)
        # The radii of the first step after the checkpoint are its running RMS, as the uninterrupted run handed them
        # over at the end of the checkpoint's step.
        self.raw_model.hand_over_clip_rms()
        for key, part in self.stateful().items():
            if key in state or key != "curves":
                part.load_state_dict(state[key])
        self.metrics = {k: float(v) for k, v in state["metrics"].items()}
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        if "curves" not in state:  # a checkpoint of an earlier version: the evaluations so far are in the log
            self.curves.rebuild(read_jsonl(self.out_dir / "metrics.jsonl"), self.tokens, self.metrics)
        restore_rng(state["rng"][self.ctx.rank])

    def _lr(self, tokens: int) -> float:
        cfg = self.cfg
        return lr_at(tokens, lr=cfg.lr, min_lr=cfg.min_lr, warmup_tokens=cfg.resolved_warmup_tokens,
                     total_tokens=cfg.total_tokens)

    def _forward(self, batch, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The model's logits for a batch, or with `labels` its summed loss; with reset_state_at_documents, its
        documents as packed sequences."""
        if self.cfg.reset_state_at_documents:
            return self.model(batch.input_ids, cu_seqlens=batch.cu_seqlens(), labels=labels)
        return self.model(batch.input_ids, labels=labels)

    def _forward_loss(self, batch) -> torch.Tensor:
        """The summed cross-entropy of a micro batch, computed by the model (fused with its head on the GPU)."""
        with _autocast(self.device, self.cfg.precision):
            return self._forward(batch, labels=batch.labels)

    def train_step(self) -> tuple[float, float]:
        """Forward/backward over the step's micro batches and clipping; returns (loss, grad norm)."""
        n_micro = self.cfg.micro_batches_per_step
        host_batches = [next(self.stream) for _ in range(n_micro)]
        local_scored = float(sum(int((b.labels != IGNORE_INDEX).sum()) for b in host_batches))
        (scored,) = self.parallel.all_reduce([local_scored])
        # DDP averages gradients over workers; scaling by world / scored makes the result the mean over all
        # scored tokens of the global batch, exactly as one process computes it.
        scale = self.ctx.world_size / max(scored, 1.0)
        if self.graphs is not None:
            loss_sum = self.graphs.step(host_batches, scale)
            self.last_batch = host_batches[-1]
        else:
            batches = [b.to(self.device, non_blocking=True) for b in host_batches]
            # Summed in float64 on the device: one host sync per step, not one per micro batch.
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            for i, batch in enumerate(batches):
                last = i == n_micro - 1
                with contextlib.nullcontext() if last else self.parallel.no_sync(self.model):
                    nll = self._forward_loss(batch)
                    (nll * scale).backward()
                loss_sum += nll.detach().double()
            self.last_batch = batches[-1]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        # The step's one host sync, which also hands the relative-clip layers their next radii: a sync per layer
        # call would leave the GPU idle between the layers, and on a GPU shared by many processes each sync waits
        # for the others' turns.
        local_loss, norm = self.raw_model.read_and_hand_over(loss_sum, grad_norm)
        (total,) = self.parallel.all_reduce([local_loss])
        return total / max(scored, 1.0), norm

    @torch.no_grad()
    def _stats_forward(self, batch) -> tuple[torch.Tensor, dict[str, float]]:
        """A forward with stats tracking on: (logits, per-layer stats and their diag/ aggregates)."""
        self.raw_model.track_stats(True)
        try:
            with _autocast(self.device, self.cfg.precision):
                logits_BTV = self._forward(batch)
            stats = self.raw_model.layer_stats()
        finally:
            self.raw_model.track_stats(False)
        return logits_BTV, stats | aggregate_diagnostics(stats)

    @torch.no_grad()
    def collect_stats(self) -> dict[str, float]:
        """Layer stats at a stats point without an evaluation: one forward of the batch `evaluate` tracks."""
        batch = next((b for batches in self.evals.values() for b in batches), self.last_batch)
        if batch is None:
            return {}
        self.model.eval()
        _, stats = self._stats_forward(batch.to(self.device))
        self.model.train()
        return stats

    @torch.no_grad()
    def evaluate(self, want_stats: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """(eval metrics, layer stats); the stats come from the first batch of the first eval set when wanted.

        A fixed eval batch makes the stats comparable across stats points and across the runs of a sweep, and
        keeps the diagnostics' extra pass out of the training step.
        """
        # Every worker scores every batch: sharded models need all workers in each forward, and the
        # numbers are then those of a single process.
        self.model.eval()
        out: dict[str, float] = {}
        stats: dict[str, float] = {}
        stats_pending = want_stats
        for name, batches in self.evals.items():
            nll, count, correct = 0.0, 0, 0
            for batch in batches:
                batch = batch.to(self.device)
                if stats_pending:
                    logits_BTV, stats = self._stats_forward(batch)
                    stats_pending = False
                else:
                    with _autocast(self.device, self.cfg.precision):
                        logits_BTV = self._forward(batch)
                logits_BTV = logits_BTV.float()
                mask = batch.labels != IGNORE_INDEX
                nll += float(F.cross_entropy(logits_BTV.flatten(0, 1), batch.labels.flatten(),
                                             ignore_index=IGNORE_INDEX, reduction="sum"))
                count += int(mask.sum())
                correct += int(((logits_BTV.argmax(-1) == batch.labels) & mask).sum())
            loss = nll / max(count, 1)
            out[f"eval/{name}/loss"] = loss
            out[f"eval/{name}/ppl"] = math.exp(min(loss, 700.0))
            out[f"eval/{name}/acc"] = correct / max(count, 1)
        self.model.train()
        if stats_pending:
            stats = self.collect_stats()
        return out, stats

    def _enter_gate(self, stoppable: bool = True) -> bool:
        """Wait for the GPU's tuning gate when the job shares its GPU (rla_ablate.train.local_memory.TuningGate);
        False when a stop was requested while waiting (only if `stoppable`)."""
        if self.gate is None or self.gate.held:
            return True
        if not self.gate.enter(stoppable, on_wait=self._say_gate_wait):
            return False
        self._say_gate_waited()
        return True

    def _say_gate_wait(self) -> None:
        self.logger.event("info", self.tokens, {"tuning_gate": "waiting: another job on this GPU is autotuning"})

    def _say_gate_waited(self) -> None:
        if self.gate is not None and self.gate.waited_s >= self.gate.SAY_AFTER_S:
            self.logger.event("info", self.tokens, {"tuning_gate_wait_s": round(self.gate.waited_s, 1)})

    def _after_autotuning(self, steps_here: int, released: bool) -> None:
        """When Triton's autotuner took the gate in the step, evaluation or statistics pass just run
        (`gates_autotuning`): say how long it waited, give the memory back (unless the caller just did: `released`)
        and leave the gate. A graphed job gives memory back only after its first step (`_release_local_memory`):
        one that autotuned later keeps the gate to its capture's end and then leaves it with its stack as grown
        (rare: its later warm-up steps have the first one's shapes)."""
        if self.gate is None or not self.gate.held:
            return
        if self.graphs is not None and 1 < steps_here <= WARMUP_STEPS:
            return
        self._say_gate_waited()
        if not released:
            self._release_local_memory(steps_here)
        self._leave_gate()

    def _leave_gate(self) -> None:
        if self.gate is not None:
            self.gate.leave()

    def _release_local_memory(self, steps_here: int) -> None:
        """Give back the local memory that spilling kernels (FLA's autotune candidates) made the driver keep
        (rla_ablate.train.local_memory); the event says how much stack a thread it had grown to.

        The driver grows the stack again for any later eager launch that needs it. A graphed job releases only
        after its first step: its second step runs every kernel eagerly, as tuned, before the capture, so the
        graph is recorded and replayed with the stack its kernels need (whether a graph's launch would grow a stack
        released after the capture is not relied on)."""
        if self.graphs is not None and steps_here != 1:
            return
        if self.local_memory.unavailable:
            if not self.local_memory.said_unavailable:  # once: packing counts on the release (sweep.calibration)
                self.local_memory.said_unavailable = True
                self.logger.event("info", self.tokens, {"local_memory_released": "unavailable: the CUDA driver's "
                                                        "stack limit could not be read (libcuda.so.1)"})
            return
        released = self.local_memory.release()
        if released is not None:
            self.logger.event("info", self.tokens, {"local_memory_released": {
                "stack_bytes_per_thread": released[0], "now": released[1]}})

    def _log(self, values: dict[str, float]) -> None:
        if not values:
            return
        self.metrics.update(values)
        self.logger.log(values, self.tokens)

    def _stop_requested(self) -> bool:
        flag = 1.0 if (self.should_stop is not None and self.should_stop()) else 0.0
        (flag,) = self.parallel.all_reduce([flag])
        return flag > 0

    def _flush_window(self, lr: float) -> None:
        w = self.window
        if w.steps == 0:
            return
        values = {"train/loss": w.loss_sum / w.steps, "train/grad_norm": w.grad_norm_sum / w.steps, "train/lr": lr,
                  "train/skipped_steps": float(self.guard.skipped)}
        if w.seconds > 0:
            tokens_per_s = w.tokens / w.seconds
            values["train/tokens_per_s"] = tokens_per_s
            if self.peak_flops:
                values["train/mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * self.ctx.world_size)
        if self.device.type == "cuda":
            values["train/peak_mem_gib"] = peak_memory_bytes(self.device, self.graphs is not None) / 2**30
        self._log(values)
        w.reset()

    def run(self) -> JobResult:
        cfg = self.cfg
        state, self.pending_state = self.pending_state, None
        if state is not None:
            self.restore(state)
            del state
            detail: dict[str, Any] = {"step": self.step}
            if self.skipped_checkpoints:
                detail["skipped_checkpoints"] = list(self.skipped_checkpoints)
            self.logger.event("resumed", self.tokens, detail)
        self.logger.event("start", self.tokens, {
            "tokens_total": cfg.total_tokens, "steps_total": cfg.total_steps, "batch_tokens": cfg.batch_tokens,
            "micro_batches_per_step": cfg.micro_batches_per_step, "world_size": self.ctx.world_size,
            "device": str(self.device), "bf16": _uses_bf16(self.device, cfg.precision),
            "cuda_graphs": cfg.cuda_graphs,
            "params": sum(p.numel() for p in self.raw_model.parameters()),
            "flops_per_token": self.flops_per_token, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "rla_sweep": __version__, "host": socket.gethostname(),
        })
        self.model.train()
        backend_reported = False
        steps_here, evaluated_here = 0, False
        saved_at = self.tokens if self.tokens else -1  # a resumed run's checkpoint holds this state already
        while self.step < cfg.total_steps:
            if self._stop_requested():
                if saved_at != self.tokens:  # the step before may have written this very state (at 1.5B, gigabytes)
                    self.save()
                return self.result(Status.CANCELLED, f"cancelled at {self.tokens:,} tokens")
            lr = self._lr(self.tokens + cfg.batch_tokens)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            next_step = self.step + 1
            last = next_step == cfg.total_steps
            if steps_here == 0 and not self.gates_autotuning and not self._enter_gate():
                continue  # stopped while waiting for the gate: the check above ends the run
            started = time.perf_counter()
            loss, grad_norm = self.train_step()
            verdict = self.guard.check(loss, grad_norm)
            if not verdict.skip:
                self.optimizer.step()
            # A graph accumulates into the gradients' own tensors: zeroed in place, never replaced.
            self.optimizer.zero_grad(set_to_none=self.graphs is None)
            self.step, self.tokens = next_step, self.tokens + cfg.batch_tokens
            self.window.seconds += time.perf_counter() - started
            self.window.tokens += cfg.batch_tokens
            if not backend_reported:
                # the first step of a process pays for compiling and autotuning its kernels: its wall time says so
                self.logger.event("info", self.tokens, {"backend": self.raw_model.kernel_used,
                                                        "glue": self.raw_model.glue_used,
                                                        "first_step_s": round(time.perf_counter() - started, 3)})
                backend_reported = True
            steps_here += 1
            if self.on_progress is not None:
                with contextlib.suppress(Exception):  # as CompositeLogger: a logger never stops the job
                    self.on_progress(self.tokens)
            early = steps_here <= WARMUP_STEPS + 1  # this process's steps that compile, autotune and capture
            if early:
                self._release_local_memory(steps_here)
                if steps_here == WARMUP_STEPS + 1 and not self.gates_autotuning:
                    self._leave_gate()
            if self.gates_autotuning:
                self._after_autotuning(steps_here, released=early)
            if verdict.skip:
                self.logger.event("skipped_step", self.tokens,
                                  {"loss": loss, "grad_norm": grad_norm, "skipped": self.guard.skipped})
                # A window flushed at this step logs the count itself: logging it here too would give the key two
                # values at one step.
                flushes = (next_step % cfg.log_every_steps == 0 or last or verdict.diverged) and self.window.steps > 0
                if not flushes:
                    self._log({"train/skipped_steps": float(self.guard.skipped)})
                if verdict.diverged:
                    self._flush_window(lr)
                    return self.result(Status.DIVERGED, f"diverged at {self.tokens} tokens")
            else:
                self.window.add(loss, grad_norm)
            if verdict.spike is not None:
                self.logger.event("loss_spike", self.tokens, verdict.spike)
            if next_step % cfg.log_every_steps == 0 or last:
                self._flush_window(lr)
            want_stats = next_step % cfg.stats_every_steps == 0 or last
            if next_step % cfg.eval_every_steps == 0 or last:
                if not evaluated_here and not self.gates_autotuning:  # a process's first evaluation compiles and
                    # tunes its shapes; waits without heeding a stop: the step's evaluation is part of its record
                    self._enter_gate(stoppable=False)
                evals, stats = self.evaluate(want_stats)
                self._release_local_memory(steps_here)
                if self.gates_autotuning:
                    self._after_autotuning(steps_here, released=True)
                elif not evaluated_here and steps_here > WARMUP_STEPS:  # in the warm-up it stays held to its end
                    self._leave_gate()
                evaluated_here = True
                self._log(stats)
                self._log(evals | self.curves.add(evals, self.tokens))
            elif want_stats:
                self._log(self.collect_stats())
                if self.gates_autotuning:  # its float32 recurrence may tune kernels of its own
                    self._after_autotuning(steps_here, released=False)
            if last:
                self.save(finished=True)
            elif next_step % cfg.checkpoint_every_steps == 0:
                self.save()
                saved_at = self.tokens
        return self.result(Status.FINISHED, None)

    def result(self, status: Status, reason: str | None) -> JobResult:
        return JobResult(status=status, tokens_done=self.tokens, metrics=dict(self.metrics), error=reason,
                         out_dir=self.out_dir)

    def failure(self, exc: BaseException) -> JobResult:
        """A failed result naming the exception (its line, traceback and cause), not only its traceback."""
        return JobResult.from_exception(exc, tokens_done=self.tokens, metrics=dict(self.metrics), out_dir=self.out_dir)


def train_worker(job: JobConfig, out_dir: str | Path, logger: MetricLogger | None,
                 should_stop: Callable[[], bool] | None, ctx: WorkerContext, shares_gpu: bool = False) -> JobResult:
    """The training run of one worker (the whole job when it runs alone). `shares_gpu`: other jobs run on the same
    GPU (packing), so the steps that may autotune pass the GPU's `TuningGate`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(job, out_dir, logger, ctx, should_stop, shares_gpu)
    try:
        return _train(trainer, out_dir, logger, ctx)
    finally:
        if trainer.gates_autotuning:  # set in setup; every return, a failed setup's included
            local_memory.gate_autotuning(None)  # a sweep worker's process may run another job next


def _train(trainer: Trainer, out_dir: Path, logger, ctx) -> JobResult:
    """`train_worker` from the trainer's setup on."""
    try:
        state = trainer.setup()
    except UserError:
        # A configuration that cannot run is the caller's to report, before any log is touched.
        raise
    except Exception as exc:
        result = trainer.failure(exc)
        if ctx.rank == 0:
            # Appended, never truncated: the history of an earlier attempt stays readable.
            CompositeLogger(JSONLLogger(out_dir / "metrics.jsonl"), logger).close(result.status, _reason(result))
        return result
    if state is not None and state.get("finished"):
        return JobResult(status=Status.FINISHED, tokens_done=int(state["tokens"]),
                         metrics={k: float(v) for k, v in state["metrics"].items()}, out_dir=out_dir)
    trainer.open_logs(None if state is None else int(state["tokens"]))
    # The trainer drops the checkpoint once restored: at 1.5B it is gigabytes of host memory.
    trainer.pending_state, state = state, None
    try:
        result = trainer.run()
    except Exception as exc:
        result = trainer.failure(exc)
    finally:
        # the graph refers back to the trainer (its forward): dropped here, its memory pool goes with the trainer
        # rather than with the next garbage collection
        trainer.graphs = None
        trainer._leave_gate()
    trainer.logger.close(result.status, _reason(result))
    return result


def _reason(result: JobResult) -> str | None:
    # The logs (metrics.jsonl's close record, MLflow's status reason) keep the whole traceback of a failure.
    return result.traceback or result.error
