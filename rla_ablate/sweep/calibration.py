"""What a job will need on a GPU before it runs: peak memory and tokens/s, from peaks measured on the GPU.

Peak memory of one training worker (bf16 autocast, fp32 master weights, AdamW, the loop of rla_ablate.train):

    static      = 4 P (weights) + 4 P (gradients) + 8 P (AdamW's two moments), divided by the workers under FSDP,
                  + 2 P (autocast's bf16 copies of the weights, alive through forward and backward)
    activations = N [ L (a_f * W_mix + m I) + l vocab ]               N = micro_batch_size * seq_len tokens
      m I       the SwiGLU MLP's bf16 tensors of the intermediate width per token: four (gate, up, silu, product;
                m = 8) with the plain-torch glue, three with FLA's fused SwiGLU (m = 6)
      l vocab   the loss: with the plain-torch glue the fp32 logits' log-softmax kept for backward plus its fp32 and
                bf16 gradients at the peak (l = 12); with FLA's fused head + cross-entropy the bf16 logits alone,
                turned into their gradient in place (l = 2; rla_ablate.models.fusion)
      W_mix     the mixer's width, (2 H dk + 3 H dv) / 5 for the linear families (q, k; v, gate, output), which is
                the hidden size for every committed preset and grows with the matched-state controls; H * head_dim
                for the transformer
      a_f       bytes per token, layer and unit of W_mix for the rest (mixer internals, norms, residual stream): the
                only calibrated number. Each measured row of the calibration table gives one a_f for its family
                and width (with m and l of the glue the row ran, its `glue`: torch where the row does not say); a
                job takes its family's, interpolated in log W_mix between calibrated widths (clamped outside them).
                Where a family has rows measured with the fused glue, its jobs are estimated from those, with the
                fused glue's m and l (what a GPU with FLA runs), and from its plain-torch rows at widths never
                measured fused (their a_f, higher: the estimate errs high); else from its plain-torch rows.

`plan` shows the estimate; `resources.gpus: auto` packs jobs on a GPU by it and each worker caps its allocator at
its share (rla_ablate.sweep.worker). The table (calibration/h200.json, written by `benchmarks/train_gpu.py
--calibrate`) also holds tokens/s measured alone on the GPU: a job's GPU-hours come from the achieved FLOP/s of
its family's nearest calibrated width, not from an assumed peak. Rows measured with CUDA graphs (`graph: true`,
`--graph on --calibrate`) give jobs with `train.cuda_graphs` their speed (the eager rows stand in where a family
has none) and never a memory coefficient: a graphed job's memory is the eager estimate plus GRAPH_EXTRA.
RDN's auxiliary pass keeps its chunk states for the backward (8 bytes a token and layer per unit of width at
head_dim 128): rows measured before it have those bytes added to their a_f (`kept_state_bytes`); rows measured
since say `rdn_states_kept`. RLA's forward kept x = v - p in fp32 for its backward until it kept only what its
target's slope needs (a byte for the clip): rows measured before that have the difference taken from their a_f
(`dropped_x_bytes`); rows measured since say `rla_x_slope`.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import Any

from rla_ablate import environment

GiB = 2**30
# Per glue: bytes per token of the MLP (per unit of intermediate width) and of the loss (per vocabulary entry).
GLUE_BYTES = {"torch": (8, 12), "fused": (6, 2)}
# What a training process holds outside the caching allocator's cap once its kernels are tuned: the CUDA context,
# the loaded kernels, and the local memory the driver keeps for the stacks of the kernels it runs. Measured with
# FLA's fused glue, the Triton cache seeded from benchmarks/gpu-tuning (`benchmarks/process_memory.py`, H100): 0.60
# GiB after the context alone, 0.73 for a whole proxy code-LM RLA run eager and 0.81 graphed. Rounded up.
CONTEXT_BYTES = int(1.0 * GiB)
# ... and what a process may hold besides while its kernels autotune: FLA's autotuner launches candidates that spill
# heavily, and the driver keeps local memory for every thread slot of the device at the largest stack one needed
# (5.05 GiB in all for that run with an empty Triton cache; 4.97-4.99 GiB for each of 11 packed jobs that ran out
# of memory together when packing reserved 1 GiB a process). A training process gives it back after its first
# steps and evaluations, and packed jobs go through those one at a time per GPU (rla_ablate.train.local_memory), so
# packing reserves it once per GPU, not once per job.
TUNING_BYTES = int(4.5 * GiB)
# nvidia-smi's memory.total exceeds what processes can allocate: 140.4 GiB on an H200, of which torch sees 139.8.
DRIVER_RESERVED_BYTES = int(1.0 * GiB)
TABLE = "h200.json"
# train.cuda_graphs: the graph's private memory pool stays reserved between replays and its blocks serve nothing
# else, so a graphed job's peak is its reserved peak. Measured (`benchmarks/train_gpu.py --graph off on`, H100,
# every family at 100M and 1.5B): the graphed reserved peak exceeds the eager allocated peak by 11.2-20.2%.
GRAPH_EXTRA = 0.25
# ... and at least this much: a graph's pool takes whole allocator segments for what its capture allocates, which at a
# proxy's size is most of its peak (graphed MQAR jobs of 0.38M parameters: reserved peaks of 0.18-0.43 GiB against
# eager estimates of 0.03-0.05 GiB, H100).
GRAPH_POOL_MIN = int(0.5 * GiB)
# The chunk of RDN's auxiliary pass, whose chunk states it keeps (`kept_state_bytes`).
KEPT_STATE_CHUNK = 64


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training worker is expected to hold at its peak (the caching allocator's max_memory_allocated)."""

    weights: int
    grads: int
    optimizer: int
    autocast_copies: int
    activations: int
    loss: int
    a_f: float
    """The calibrated activation coefficient used (bytes per token, layer and unit of mixer width)."""
    source: str
    """Which calibration rows gave a_f."""
    glue: str
    """The glue the estimate is for: "fused" (FLA's kernels) or "torch" (module docstring)."""
    graph_pool: int = 0
    """What a CUDA graph's pool holds beyond the eager peak (train.cuda_graphs; GRAPH_EXTRA of the rest, at least
    GRAPH_POOL_MIN), or 0."""

    @property
    def total(self) -> int:
        return (self.weights + self.grads + self.optimizer + self.autocast_copies + self.activations + self.loss
                + self.graph_pool)

    @property
    def gib(self) -> float:
        return self.total / GiB

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "gib": self.gib}


@dataclass(frozen=True)
class SpeedEstimate:
    tokens_per_s: float
    """Training tokens/s of the job alone on one GPU."""
    source: str
    """'measured <preset> ...' or 'assumed <TFLOP/s>'."""


def mixer_width(model: Any) -> float:
    if model.family == "transformer":
        return float(model.num_heads * model.head_dim)
    return (2 * model.num_heads * model.head_dim + 3 * model.num_heads * model.head_v_dim) / 5


@functools.lru_cache(maxsize=4)
def load_table(name: str = TABLE) -> dict[str, Any]:
    """The calibration table shipped with the package: {"device", "gpu_memory_bytes", "rows": [...]}."""
    text = resources.files("rla_ablate.sweep").joinpath("calibration", name).read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=4)
def _rows(name: str = TABLE) -> list[tuple[dict[str, Any], Any]]:
    """(row, its ModelConfig) for every row of the table."""
    from rla_ablate.models import ModelConfig

    return [(row, ModelConfig.model_validate(row["model"])) for row in load_table(name)["rows"]]


def _static_bytes(model: Any, train: Any) -> tuple[int, int, int, int]:
    from rla_ablate.models import count_params

    P = count_params(model)
    shards = train.num_workers if train.fsdp else 1
    return 4 * P // shards, 4 * P // shards, 8 * P // shards, 2 * P


def _per_token_other(model: Any, glue: str) -> tuple[float, float]:
    """(MLP bytes per token over all layers, loss bytes per token) with `glue`."""
    mlp, loss = GLUE_BYTES[glue]
    return float(model.num_layers * mlp * model.intermediate_size), float(loss * model.vocab_size)


def row_glue(row: dict[str, Any]) -> str:
    return row.get("glue", "torch")


def kept_state_bytes(model: Any) -> float:
    """Bytes per token and layer that RDN's auxiliary pass keeps from its forward for its backward (the `triton`
    backend's rla_ablate.ops.triton.rdn.DeltaKeepStates: the chunk states h, H dk dv bf16 per chunk of 64 tokens,
    the writes v_new and w, H dv and H dk bf16 a token); 0 for every other model."""
    if model.family != "rdn" or model.fit != "residual":
        return 0.0
    H, dk, dv = model.num_heads, model.head_dim, model.head_v_dim
    return 2.0 * (H * dk * dv / KEPT_STATE_CHUNK + H * dv + H * dk)


def dropped_x_bytes(model: Any) -> float:
    """Bytes per token and layer that RLA's forward (the `triton` backend's rla_ablate.ops.triton.rla) no longer keeps
    for its backward: it kept x = v - p in fp32 (4 bytes an element, H dv a token) and keeps only what its target's
    slope needs, the clip's as a byte, tanh's x in fp32, nothing for the identity; 0 for every other model."""
    if model.family != "rla" or model.fit == "off":
        return 0.0
    kept = {"clip": 1.0, "tanh": 4.0, "identity": 0.0}[model.target]
    return (4.0 - kept) * model.num_heads * model.head_v_dim


def row_a_f(row: dict[str, Any], model: Any) -> float:
    """The activation coefficient one measured row implies (see the module docstring). A row measured before RDN's
    auxiliary pass kept its states (no `rdn_states_kept`) gets their bytes added: its peak lacks them; one measured
    before RLA kept x's slope instead of x (no `rla_x_slope`) gets the bytes it held then taken away."""
    train = _Shape(row["micro_batch_size"], row["seq_len"])
    static = sum(_static_bytes(model, train))
    mlp, loss = _per_token_other(model, row_glue(row))
    n = train.micro_batch_size * train.seq_len
    rest = row["peak_gib"] * GiB - static - n * (mlp + loss)
    if not row.get("rdn_states_kept"):
        rest += n * model.num_layers * kept_state_bytes(model)
    if not row.get("rla_x_slope"):
        rest -= n * model.num_layers * dropped_x_bytes(model)
    return rest / (n * model.num_layers * mixer_width(model))


@dataclass(frozen=True)
class _Shape:
    micro_batch_size: int
    seq_len: int
    num_workers: int = 1
    fsdp: bool = False


def _of_glue(rows: list[tuple[dict[str, Any], Any]], glue: str) -> tuple[str, list[tuple[dict[str, Any], Any]]]:
    """(the glue, the rows) a family's estimates take. With the jobs' glue "auto": the family's rows measured with
    the fused glue where it has any, and its plain-torch rows at widths never measured fused (there they stand in:
    their memory errs high, their speeds give the families' ratios at that width, which a wall-clock-matched
    control needs). With "torch" (RLA_GLUE): the torch rows alone (a family measured with the fused glue only then
    takes those rows' coefficients with the torch glue's bytes)."""
    fused = [r for r in rows if row_glue(r[0]) == "fused"]
    torch_rows = [r for r in rows if row_glue(r[0]) == "torch"]
    if glue == "auto" and fused:
        widths = {mixer_width(m) for _, m in fused}
        return "fused", fused + [r for r in torch_rows if mixer_width(r[1]) not in widths]
    return "torch", torch_rows or fused


@functools.lru_cache(maxsize=8)
def _coefficients(name: str = TABLE, glue: str = "auto") -> dict[str, tuple[str, list[tuple[float, float, str]]]]:
    """family -> (glue, sorted [(log width, the largest a_f of that width's rows, presets)]) for jobs of `glue`
    (`_of_glue`). The largest: jobs of one shape peak up to ~10% apart (which FLA kernel configuration a process
    tuned, cuBLAS workspaces), and a packed job must fit at its worst."""
    families: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for row, model in _rows(name):
        # a graphed row's peak is its reserved peak, pool included: graphed jobs add GRAPH_EXTRA to eager estimates
        if row.get("peak_gib") is not None and not row.get("graph"):
            families.setdefault(model.family, []).append((row, model))
    out = {}
    for fam, rows in families.items():
        used, chosen = _of_glue(rows, glue)
        widths: dict[float, list[tuple[float, str]]] = {}
        for row, model in chosen:
            # a plain-torch row among the fused ones (`_of_glue`) keeps its coefficient, with the fused glue's MLP
            # and loss bytes: the fused block glue saves more than that (100m: a_f 47 against 89), so the estimate
            # errs high at its width instead of stretching a narrower width's fused coefficient
            label = row["preset"] + (" (torch glue)" if used == "fused" and row_glue(row) == "torch" else "")
            widths.setdefault(mixer_width(model), []).append((row_a_f(row, model), label))
        out[fam] = (used, sorted((math.log(w), max(a for a, _ in v), max(v)[1]) for w, v in widths.items()))
    return out


def _a_f(model: Any, name: str = TABLE) -> tuple[float, str, str]:
    """(a_f, which rows gave it, the glue the estimate is for) for `model`, its jobs running the glue RLA_GLUE
    asks for (rla_ablate.environment)."""
    coeffs = _coefficients(name, environment.glue_mode())
    if model.family not in coeffs:
        # An uncalibrated family takes the largest coefficient of the calibrated ones with the torch glue's bytes:
        # the estimate errs high.
        best = max((p for _, ps in coeffs.values() for p in ps), key=lambda p: p[1])
        return best[1], f"uncalibrated family; the largest coefficient ({best[2]})", "torch"
    glue, pts = coeffs[model.family]
    x = math.log(mixer_width(model))
    xs = [p[0] for p in pts]
    i = bisect.bisect_left(xs, x)
    if i < len(pts) and math.isclose(xs[i], x):
        return pts[i][1], pts[i][2], glue
    if i == 0:
        return pts[0][1], pts[0][2], glue
    if i == len(pts):
        return pts[-1][1], pts[-1][2], glue
    (x0, a0, s0), (x1, a1, s1) = pts[i - 1], pts[i]
    t = (x - x0) / (x1 - x0)
    return a0 + t * (a1 - a0), f"{s0} .. {s1}", glue


def estimate_memory(job: Any, name: str = TABLE) -> MemoryEstimate:
    """Peak memory of one training worker of `job` (a JobConfig) on a GPU."""
    model, train = job.model, job.train
    weights, grads, optimizer, copies = _static_bytes(model, train)
    a_f, source, glue = _a_f(model, name)
    mlp, loss = _per_token_other(model, glue)
    n = train.micro_batch_size * train.seq_len
    acts = n * (model.num_layers * a_f * mixer_width(model) + mlp)
    eager = MemoryEstimate(weights=weights, grads=grads, optimizer=optimizer, autocast_copies=copies,
                           activations=int(acts), loss=int(n * loss), a_f=a_f, source=source, glue=glue)
    if not train.cuda_graphs:
        return eager
    return replace(eager, graph_pool=max(int(GRAPH_EXTRA * eager.total), GRAPH_POOL_MIN))


def estimate_speed(job: Any, assumed_tflops: float, name: str = TABLE) -> SpeedEstimate:
    """Tokens/s of `job` alone on one GPU, from its family's rows measured alone (the sequence length nearest the
    job's at each width): between calibrated widths the achieved FLOP/s is interpolated in log width and scaled to
    the job's FLOPs per token; above them the widest row's FLOP/s holds; below them the narrowest row's tokens/s
    (small models are bound by kernel launches, not FLOPs: they are not assumed faster). `assumed_tflops` serves a
    family without a row."""
    from rla_ablate.models.accounting import flops_per_token

    model, train = job.model, job.train
    flops = flops_per_token(model, train.seq_len)
    rows = [(r, m) for r, m in _rows(name) if r.get("tokens_per_s") and m.family == model.family]
    # A graphed job (train.cuda_graphs) takes its family's graphed rows at the widths the table has them (at 100M a
    # linear family's graphed step ran 1.4-2.1x the eager one), eager rows at the other widths (there the estimate
    # errs slow); an eager job takes eager rows only.
    eager = [r for r in rows if not r[0].get("graph")]
    if train.cuda_graphs:
        graphed = [r for r in rows if r[0].get("graph")]
        widths = {mixer_width(m) for _, m in graphed}
        rows = graphed + [r for r in eager if mixer_width(r[1]) not in widths]
    else:
        rows = eager
    _, rows = _of_glue(rows, environment.glue_mode())  # the rows of the jobs' glue, as for memory
    if not rows:
        return SpeedEstimate(assumed_tflops * 1e12 / flops, f"assumed {assumed_tflops:g} TFLOP/s")
    best: dict[float, tuple] = {}
    for r, m in rows:
        w = math.log(mixer_width(m))
        key = (abs(r["seq_len"] - train.seq_len), abs(r["micro_batch_size"] - train.micro_batch_size))
        if w not in best or key < best[w][0]:
            best[w] = (key, r, r["tokens_per_s"] * flops_per_token(m, r["seq_len"]))
    pts = sorted((w, r, achieved) for w, (_, r, achieved) in best.items())
    x = math.log(mixer_width(model))

    def label(r: dict) -> str:
        graph = ", CUDA graph" if r.get("graph") else ""
        return f"{r['preset']} ({r['micro_batch_size']} x {r['seq_len']}, {r.get('backend', '?')}{graph})"

    if x < pts[0][0] - 1e-9:
        # Launch-bound: a step's time goes with its kernel launches, which go with the depth. Deeper than the row,
        # fewer tokens/s; shallower, not more (the launches outside the layers stay); and never faster than the
        # row's achieved FLOP/s would make it.
        row = pts[0][1]
        depth = min(1.0, int(row["model"]["num_layers"]) / model.num_layers)
        deeper = ", deeper: fewer tokens/s" if depth < 1.0 else ""
        return SpeedEstimate(min(float(row["tokens_per_s"]) * depth, pts[0][2] / flops),
                             f"measured {label(row)}, narrower model{deeper}")
    if x >= pts[-1][0] - 1e-9:
        return SpeedEstimate(pts[-1][2] / flops, f"measured {label(pts[-1][1])}")
    i = bisect.bisect_left([p[0] for p in pts], x)
    (x0, r0, f0), (x1, r1, f1) = pts[i - 1], pts[i]
    achieved = math.exp(math.log(f0) + (x - x0) / (x1 - x0) * (math.log(f1) - math.log(f0)))
    return SpeedEstimate(achieved / flops, f"measured {label(r0)} .. {label(r1)}")


def usable_bytes(gpu_bytes: int) -> int:
    """What the jobs on one GPU share: the device's memory less what the driver keeps and the one autotuning
    process's room (`TUNING_BYTES`)."""
    return gpu_bytes - DRIVER_RESERVED_BYTES - TUNING_BYTES


def gpu_share(estimate: MemoryEstimate, gpu_bytes: int, margin: float) -> float:
    """The fraction of one GPU a job needs: its estimate plus `margin`, plus the process's context, over what the
    jobs on a device share (`usable_bytes`), rounded up to a hundredth (Ray's fractional GPUs add up exactly at that
    grain)."""
    need = estimate.total * (1.0 + margin) + CONTEXT_BYTES
    return math.ceil(need / usable_bytes(gpu_bytes) * 100 - 1e-9) / 100


def allocator_cap(share: float, gpu_bytes: int) -> float:
    """What `torch.cuda.set_per_process_memory_fraction` (a fraction of the device's total) gets for a share: the
    share of the allocatable memory less the context, which lives outside the cap."""
    return max(0.01, (share * usable_bytes(gpu_bytes) - CONTEXT_BYTES) / gpu_bytes)
