"""How one worker's model is spread over the data-parallel workers: alone, DDP, or FSDP2.

`make_parallel` picks one of the three once per job; the Trainer (rla_ablate.train.loop) asks it to wrap the
model, to sum numbers and gather objects over the workers, and for the model and optimizer state a checkpoint
holds. The workers and their process group are started by Ray Train (rla_ablate.train.distributed); this module
only uses the group.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch


@dataclass
class WorkerContext:
    """Who this process is in a data-parallel job (rank 0 of 1 when it runs alone)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class Single:
    """One process: the model as built, and sums and gathers over this process alone."""

    def __init__(self, ctx: WorkerContext, device: torch.device):
        self.ctx, self.device = ctx, device

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training step calls (the model itself, or a wrapper around it)."""
        return model

    def all_reduce(self, values: list[float]) -> list[float]:
        """`values` summed over the workers."""
        return values

    def gather(self, obj: Any) -> list[Any]:
        """Every worker's `obj`, in rank order."""
        return [obj]

    def barrier(self) -> None:
        pass

    def no_sync(self, model: torch.nn.Module) -> ContextManager:
        """Around a micro batch that is not the step's last: skips the gradient reduction when the wrapper can."""
        return contextlib.nullcontext()

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """The model's and the optimizer's state as a checkpoint holds it; `model` is the unwrapped model."""
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


class DDP(Single):
    """DistributedDataParallel: every worker holds the whole model; gradients are averaged over the workers."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def all_reduce(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.ctx.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        torch.distributed.barrier()

    def no_sync(self, model: torch.nn.Module) -> ContextManager:
        from torch.nn.parallel import DistributedDataParallel

        assert isinstance(model, DistributedDataParallel), "no_sync takes the module wrap() returned"
        return model.no_sync()


class FSDP2(DDP):
    """FSDP2 (`fully_shard`): one unit per block plus the root (embeddings, final norm, head); bf16 compute and
    fp32 reductions when the job trains in bf16. Checkpoints hold the unsharded state, so every worker takes part
    in saving and loading it."""

    def __init__(self, ctx: WorkerContext, device: torch.device, bf16: bool):
        super().__init__(ctx, device)
        self.bf16 = bf16

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy()
        if self.bf16:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        layers = model.layers
        assert isinstance(layers, torch.nn.ModuleList), "the models of rla_ablate.models keep their blocks in .layers"
        for block in layers:
            fully_shard(block, mp_policy=mp)
        # fully_shard changes the model in place: the model and the module the step calls are one object.
        fully_shard(model, mp_policy=mp)
        return model

    def no_sync(self, model: torch.nn.Module) -> ContextManager:
        # An FSDP2 module has no no_sync: every micro batch reduce-scatters its gradients.
        return contextlib.nullcontext()

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """Unsharded model and optimizer state on CPU (collective: every worker calls it)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"model": get_model_state_dict(model, options=options),
                "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}

    def load_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


def make_parallel(ctx: WorkerContext, device: torch.device, fsdp: bool, bf16: bool) -> Single:
    """The parallelism of this worker: alone, DDP, or FSDP2 when the job asks for it (`train.fsdp`)."""
    if not ctx.distributed:
        return Single(ctx, device)
    if fsdp:
        return FSDP2(ctx, device, bf16)
    return DDP(ctx, device)
