"""`GraphedMicroStep`: a micro batch's forward and backward captured once in a CUDA graph and replayed.

A small model's training step on a fast GPU waits for the host: every block launches its kernels one by one from
Python (FLA's through their autotuning wrappers), and the GPU runs them faster than the host issues them. A CUDA
graph records the kernels of one micro batch's forward and backward once; each later micro batch is then one
launch. What stays eager, because it is cheap to launch and must stay exact: the gradient clip, the divergence
guard's one host read, and the AdamW step (skipped by the guard on a non-finite loss, as in an eager step).

How it keeps the eager step's numbers:
- The inputs, the loss scale (world size / scored tokens, which varies per step) and the loss sum live in static
  device tensors; every micro batch is copied into the same input buffers.
- Gradients accumulate into the parameters' own `.grad` tensors, which exist from the first eager step on and are
  zeroed in place after every optimizer step (never set to None: the graph holds their addresses).
- The first `warmup_steps` steps of a process run the same code eagerly, on the side stream the capture uses:
  Triton compiles and autotunes, FLA copies its layouts to the device, cuBLAS makes its workspaces. None of that
  can happen inside a capture. The capture itself runs no kernel, so the step that captures then replays.
- Autocast is entered inside the recorded forward, so its weight-cast cache ends there too: every replay casts the
  weights the last step updated.

What a graph cannot hold is refused when the job's config is read (TrainConfig): data-dependent shapes and host
reads (packed documents), data-parallel hooks, and the CPU. The relative clip's radius changes every step but stays
on the device (rla_ablate.models.layers), so a graph replays it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from rla_ablate.data.stream import Batch

# Eager steps of a process before the capture: the first compiles and autotunes every kernel (forward and
# backward), the second runs them as tuned, so nothing a graph cannot record is left for the capture.
WARMUP_STEPS = 2


def peak_memory_bytes(device: torch.device, graphed: bool) -> int:
    """A training process's peak GPU memory, what `plan`'s estimate is checked against: the allocated peak, or with
    a CUDA graph the reserved one (the graph's memory pool stays reserved between replays, under evals and the
    optimizer, though its blocks do not count as allocated there)."""
    return (torch.cuda.max_memory_reserved if graphed else torch.cuda.max_memory_allocated)(device)


class GraphedMicroStep:
    """Runs the micro batches of each training step: eagerly for the first `warmup_steps` steps, then by replaying
    one captured graph per micro batch.

    `forward_loss(input_ids, labels)` returns the summed loss of a micro batch (a float32 scalar with a graph to
    the parameters); it must run no host sync and keep its shapes. `step(batches, scale)` runs the backward of
    `loss * scale` for every batch, leaves the gradients accumulated in `.grad`, and returns the float64 sum of the
    batches' losses on the device.
    """

    def __init__(self, forward_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device,
                 warmup_steps: int = WARMUP_STEPS, on_capture: Callable[[dict], None] | None = None):
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        if warmup_steps < 1:
            raise ValueError("a graph is captured after at least one eager step (compiling, autotuning)")
        self.forward_loss, self.device = forward_loss, device
        self.warmup_steps, self.on_capture = warmup_steps, on_capture
        self.stream = torch.cuda.Stream(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        # (input ids, labels): the static buffers every micro batch is copied into, made by the first step
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.scale = torch.zeros((), dtype=torch.float32, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)

    def _micro(self) -> None:
        """One micro batch from the static buffers: what the graph records and the warm-up runs."""
        assert self.buffers is not None
        inputs, labels = self.buffers
        nll = self.forward_loss(inputs, labels)
        (nll * self.scale).backward()
        self.loss_sum += nll.detach().double()

    def _load(self, batch: Batch) -> None:
        if self.buffers is None:
            self.buffers = (torch.empty(batch.input_ids.shape, dtype=batch.input_ids.dtype, device=self.device),
                            torch.empty(batch.labels.shape, dtype=batch.labels.dtype, device=self.device))
        inputs, labels = self.buffers
        if batch.input_ids.shape != inputs.shape or batch.labels.shape != labels.shape:
            raise ValueError(f"a CUDA graph replays one batch shape: {tuple(inputs.shape)} captured, "
                             f"{tuple(batch.input_ids.shape)} given")
        inputs.copy_(batch.input_ids, non_blocking=True)
        labels.copy_(batch.labels, non_blocking=True)

    def step(self, batches: list[Batch], scale: float) -> torch.Tensor:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            self.scale.fill_(scale)
            self.loss_sum.zero_()
            if self.graph is None and self.eager_steps >= self.warmup_steps:
                self.capture()
            for batch in batches:
                self._load(batch)
                if self.graph is None:
                    self._micro()
                else:
                    self.graph.replay()
        current.wait_stream(self.stream)
        if self.graph is None:
            self.eager_steps += 1
        return self.loss_sum

    def capture(self) -> None:
        """Record the graph now (`step` does so once `warmup_steps` eager steps have run); runs no kernel."""
        if self.graph is not None:
            return
        if self.buffers is None:
            raise RuntimeError("capture after an eager step: it compiles and autotunes what the graph records")
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        # Recording runs no kernel, so neither the gradients nor the loss sum change here; `step` then replays.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.graph(graph, stream=self.stream):
            self._micro()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.graph = graph
        if self.on_capture is not None:
            self.on_capture({"cuda_graph": "captured", "after_eager_steps": self.eager_steps,
                             "capture_s": round(time.perf_counter() - started, 3)})
