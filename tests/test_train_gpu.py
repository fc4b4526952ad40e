"""The real training step on the GPU for every job a sweep can produce: each family, each registry ablation (on the
families it fits) and both derived controls, expanded from a sweep file by the sweep's own expansion, then trained
by `run_job` as a sweep worker does (bf16 autocast, backend auto, AdamW steps, eval, checkpoint). Skipped without
CUDA; `bash benchmarks/gpu_check.sh train-step` runs it on the GPU node.

The model keeps the 100m presets' mixer shape (6 heads x 128, hidden 768), the shape a GPU sweep compiles and
autotunes for, on 2 layers and 256-token sequences so that the whole set runs in minutes.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FAMILIES = ["rla", "rdn", "sgla", "gdn", "transformer"]


def _sweep_jobs():
    import tempfile
    from pathlib import Path

    import yaml

    from rla_ablate.models.ablations import ABLATIONS
    from rla_ablate.sweep.expand import load_sweep

    sweep = {
        "name": "gpu-every-job",
        "models": [{"preset": f"100m-{fam}", "overrides": {"num_layers": 2, "vocab_size": 257}} for fam in FAMILIES],
        "base": {
            "train": {"tokens": 4096, "seq_len": 256, "batch_tokens": 2048, "micro_batch_size": 4,
                      "precision": "bf16", "device": "cuda", "eval_every_tokens": 4096,
                      "checkpoint_every_tokens": 2048, "warmup_tokens": 0},
            "data": {"kind": "stdlib"},
            "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 2048}],
        },
        # the registry's ablations on every family each fits, and both derived controls
        "ablations": list(ABLATIONS),
        "controls": ["matched_state", "matched_params"],
        "seeds": [0],
        "resources": {"gpus": "auto"},  # device cuda needs a GPU share
    }
    with tempfile.TemporaryDirectory(prefix="gpu-every-job") as d:  # collected in every test run: leave nothing
        f = Path(d) / "sweep.yaml"
        f.write_text(yaml.safe_dump(sweep))
        return load_sweep(f).jobs


JOBS = _sweep_jobs()


@pytest.mark.parametrize("sweep_job", JOBS, ids=[j.name.replace("/seed0", "") for j in JOBS])
def test_every_sweep_job_trains_on_the_gpu(sweep_job, tmp_path):
    from rla_ablate.train import read_jsonl, run_job

    result = run_job(sweep_job.job, tmp_path)
    assert result.status == "finished", result.error
    records = read_jsonl(tmp_path / "metrics.jsonl")
    losses = [r["values"]["train/loss"] for r in records if r["type"] == "metrics" and "train/loss" in r["values"]]
    assert losses and all(isinstance(v, float) and math.isfinite(v) for v in losses), losses
    evals = [r["values"]["eval/val/loss"] for r in records if r["type"] == "metrics" and "eval/val/loss" in r["values"]]
    assert evals and all(math.isfinite(v) for v in evals)
    backend = next(r["detail"]["backend"] for r in records if r["type"] == "event" and r["name"] == "info")
    if sweep_job.family == "transformer":
        assert backend == "sdpa", backend
    else:  # "triton/<implementation>": RLA on the fused kernels, RDN on the one-pass base, baselines on FLA's kernels
        from rla_ablate.ops.triton import backend as tb

        fit = sweep_job.job.model.fit
        rdn = tb.RDN_FUSED if fit == "residual" and tb.RDN.one_function else tb.RDN_READS
        want = {"off": tb.FLA_GLUE}.get(fit, tb.RLA_FUSED if sweep_job.job.model.family == "rla" else rdn)
        assert backend == f"triton/{want}", backend
    peaks = [r["values"]["train/peak_mem_gib"] for r in records if r["type"] == "metrics"
             and "train/peak_mem_gib" in r["values"]]
    assert peaks and peaks[-1] > 0


# CUDA graphs (train.cuda_graphs, rla_ablate/train/graphs.py): 8 steps of two micro batches each, so the graph replays
# twice a step into accumulated gradients; steps 1-2 run eagerly, step 3 captures. A high learning rate moves the
# weights far, so a graph that replayed stale weights (a cast cache), missed the zeroing or froze the loss scale
# would show in the loss after a few steps.
def _graph_job(family: str, model_changes: dict | None = None, **train):
    from rla_ablate.data.config import StdlibData
    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig, TrainConfig

    model = load_preset(f"100m-{family}").replace(num_layers=2, vocab_size=257, **(model_changes or {}))
    settings = dict(tokens=8 * 2048, seq_len=256, micro_batch_size=4, batch_tokens=2048, precision="bf16",
                    device="cuda", lr=3e-3, warmup_tokens=0, log_every_tokens=2048, eval_every_tokens=4 * 2048,
                    checkpoint_every_tokens=4 * 2048, keep_checkpoints=4)
    return JobConfig(model=model, train=TrainConfig(**(settings | train)), data=StdlibData(),
                     eval=[{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 2048}])


def _curve(out, key="train/loss"):
    from rla_ablate.train import read_jsonl

    return [(r["step"], r["values"][key]) for r in read_jsonl(out / "metrics.jsonl")
            if r["type"] == "metrics" and key in r["values"]]


def _final_weights(out):
    from rla_ablate.train.checkpoint import list_checkpoints, load_checkpoint

    return load_checkpoint(list_checkpoints(out)[-1][1])["model"]


# The largest relative difference allowed between a graphed and an eager run's losses after 8 steps, and the
# largest relative RMS difference of all their weights: the same kernels in the same order give the same numbers,
# and a wrong replay differs by percents. (Not zero: a kernel that accumulates with atomics, e.g. SDPA's backward,
# may round a gradient differently, which AdamW's first steps turn into lr-sized moves of a few weights.)
GRAPH_RTOL = 1e-4
WEIGHTS_RTOL = 1e-3


def _weights_differ(got: dict, want: dict) -> float:
    """sqrt(sum |got - want|^2 / sum |want|^2) over every tensor of two state dicts."""
    num = sum(float((got[k].double() - v.double()).square().sum()) for k, v in want.items())
    den = sum(float(v.double().square().sum()) for v in want.values())
    return (num / den) ** 0.5


# every family, and the residual families with the proxies' relative clip, whose radius changes every step
GRAPH_CASES = [(family, None) for family in FAMILIES] + [
    (family, {"clip_mode": "relative", "clip": 2.0}) for family in ("rla", "rdn")]


@pytest.mark.parametrize("family, model_changes", GRAPH_CASES,
                         ids=[f + ("-relative-clip" if m else "") for f, m in GRAPH_CASES])
def test_cuda_graphs_train_as_the_eager_loop(family, model_changes, tmp_path):
    from rla_ablate.train import read_jsonl, run_job

    runs = {}
    for graphs in (False, True):
        out = tmp_path / f"graphs-{graphs}"
        result = run_job(_graph_job(family, model_changes, cuda_graphs=graphs), out)
        assert result.status == "finished", result.error
        runs[graphs] = out
    eager, graphed = (_curve(runs[g]) for g in (False, True))
    assert [s for s, _ in eager] == [s for s, _ in graphed] == [2048 * i for i in range(1, 9)]
    diff = max(abs(a - b) / abs(b) for (_, a), (_, b) in zip(graphed, eager))
    assert diff <= GRAPH_RTOL, (family, diff, graphed, eager)
    assert eager[-1][1] < eager[0][1] - 0.1, eager  # it trained: the comparison is of moved weights
    (_, ev_eager), (_, ev_graphed) = _curve(runs[False], "eval/val/loss")[-1], _curve(runs[True], "eval/val/loss")[-1]
    assert abs(ev_graphed - ev_eager) <= GRAPH_RTOL * abs(ev_eager), (ev_graphed, ev_eager)
    assert _weights_differ(_final_weights(runs[True]), _final_weights(runs[False])) <= WEIGHTS_RTOL
    events = [r for r in read_jsonl(runs[True] / "metrics.jsonl") if r["type"] == "event" and r["name"] == "info"]
    captured = [r for r in events if r["detail"].get("cuda_graph") == "captured"]
    assert len(captured) == 1 and captured[0]["detail"]["after_eager_steps"] == 2 and captured[0]["step"] == 2 * 2048


@pytest.mark.parametrize("family", ["rla", "rdn"])
def test_cuda_graphs_resume_as_the_uninterrupted_run(family, tmp_path):
    # relative clip: the resumed process hands the restored running RMS over itself
    """Cancelled after its checkpoint at step 4, the resumed run warms up and captures again (a new process has no
    graph) and ends where the uninterrupted graphed run ends."""
    from rla_ablate.train import read_jsonl, run_job

    job = _graph_job(family, {"clip_mode": "relative", "clip": 2.0}, cuda_graphs=True)
    straight = tmp_path / "straight"
    assert run_job(job, straight).status == "finished"
    calls = {"n": 0}

    def stop_before_fifth_step():
        calls["n"] += 1
        return calls["n"] == 5

    out = tmp_path / "resumed"
    assert run_job(job, out, should_stop=stop_before_fifth_step).status == "cancelled"
    assert run_job(job, out).status == "finished"
    got, want = _curve(out), _curve(straight)
    assert [s for s, _ in got] == [s for s, _ in want]
    assert max(abs(a - b) / abs(b) for (_, a), (_, b) in zip(got, want)) <= GRAPH_RTOL
    assert _weights_differ(_final_weights(out), _final_weights(straight)) <= WEIGHTS_RTOL
    captures = [r["step"] for r in read_jsonl(out / "metrics.jsonl")
                if r["type"] == "event" and r["detail"].get("cuda_graph") == "captured"]
    assert captures == [2 * 2048, 6 * 2048], captures


def test_cuda_graphs_skip_non_finite_steps_and_end_diverged(tmp_path):
    """A learning rate of 1e30: the first update overflows the weights, so every later step's loss or gradient norm
    is not finite; the guard skips step 2 (eager) and steps 3-4 (captured, replayed; their gradients zeroed in
    place) and ends the job as diverged at the third skip, as it does eagerly."""
    from rla_ablate.train import read_jsonl, run_job

    job = _graph_job("rla", cuda_graphs=True, lr=1e30, grad_clip=None, max_skipped_steps=2, tokens=16 * 2048)
    result = run_job(job, tmp_path)
    assert result.status == "diverged", (result.status, result.error)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    skipped = [r for r in records if r["type"] == "event" and r["name"] == "skipped_step"]
    assert [r["step"] for r in skipped] == [2 * 2048, 3 * 2048, 4 * 2048], skipped
    assert any(r["type"] == "event" and r["detail"].get("cuda_graph") == "captured" for r in records)


def test_a_graphed_micro_step_gives_the_eager_gradients_whatever_the_scale():
    """`GraphedMicroStep` against the eager micro step, bit for bit, on a model with the relative clip: a loss scale
    that changes every step (the scored tokens do), a step whose scale is NaN (its gradients are NaN and are zeroed
    in place, as after a skipped step), and the steps after it; two micro batches a step."""
    from rla_ablate.data.stream import Batch
    from rla_ablate.models import build_model, load_preset
    from rla_ablate.train.graphs import GraphedMicroStep

    torch.manual_seed(0)
    cfg = load_preset("proxy-lm-rla").replace(num_layers=2)
    models = [build_model(cfg).cuda().train() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())

    def forward_loss(model):
        def run(ids, labels):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(ids, labels=labels)
        return run

    graphed = GraphedMicroStep(forward_loss(models[1]), torch.device("cuda"))
    gen = torch.Generator().manual_seed(1)
    scales = [1 / 4096, 1 / 3000, float("nan"), 1 / 2048, 1 / 5000, 1 / 4096]
    for step, scale in enumerate(scales):
        batches = [Batch(*torch.randint(0, cfg.vocab_size, (2, 4, 256), generator=gen)) for _ in range(2)]
        eager_sum = torch.zeros((), dtype=torch.float64, device="cuda")
        for b in batches:
            nll = forward_loss(models[0])(b.input_ids.cuda(), b.labels.cuda())
            (nll * scale).backward()
            eager_sum += nll.detach().double()
        graph_sum = graphed.step(batches, scale)
        assert graphed.eager_steps == min(step + 1, 2) and (graphed.graph is not None) == (step >= 2)
        assert torch.equal(graph_sum, eager_sum), (step, graph_sum, eager_sum)
        for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
            if math.isnan(scale):
                assert a.grad.isnan().all() and b.grad.isnan().all(), (step, name)
            else:
                assert torch.equal(a.grad, b.grad), (step, name)
        for model in models:
            model.hand_over_clip_rms()
            with torch.no_grad():
                for p in model.parameters():
                    if not math.isnan(scale):
                        p -= 1e-3 * p.grad  # a plain SGD step, the same on both
            model.zero_grad(set_to_none=False)


# A kernel that spills: 128 x 128 tiles on one warp hold over a thousand values a thread.
SPILLING_SCRIPT = '''
import json, sys
import torch, triton, triton.language as tl
from rla_ablate.train.local_memory import LocalMemory, stack_limit


@triton.jit
def spill(x, y, N: tl.constexpr):
    r = tl.arange(0, N)
    o = r[:, None] * N + r[None, :]
    a = tl.load(x + o)
    b = tl.cumsum(a, 1)
    tl.store(y + o, tl.cumsum(b, 0) + tl.trans(a) * b)


device = torch.device("cuda")
x = torch.randn(128 * 128, device=device)
y = torch.empty_like(x)
memory = LocalMemory(device)
spill[(1024,)](x, y, N=128, num_warps=1)
torch.cuda.synchronize()
grown, free_grown = stack_limit(device), torch.cuda.mem_get_info()[0]
want = y.clone()
released = memory.release()
free_released = torch.cuda.mem_get_info()[0]
spill[(1024,)](x, y, N=128, num_warps=1)  # grows the stack again, as the first launch did
torch.cuda.synchronize()
again, same = stack_limit(device), bool(torch.equal(y, want))
# a graphed job's protocol (Trainer._release_local_memory): released after its first step, an eager step, then the
# capture and its replays
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    spill[(1024,)](x, y, N=128, num_warps=1)
y.zero_()
graph.replay()
torch.cuda.synchronize()
print(json.dumps({"baseline": memory.baseline, "grown": grown, "released": released, "given_back": free_released - free_grown,
                  "again": again, "same": same, "replayed": bool(torch.equal(y, want))}))
'''


def test_the_local_memory_a_spilling_kernel_grew_is_given_back(tmp_path):
    """`LocalMemory.release` (called by the training loop after its first steps and evaluations) sets the driver's
    stack limit back and the device gets the memory back; a later launch that needs the stack runs right, and so
    does a graph captured after it.
    In a fresh process: the driver's limit only grows within one."""
    import json
    import subprocess
    import sys

    script = tmp_path / "spill.py"
    script.write_text(SPILLING_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["grown"] > got["baseline"], got
    assert got["released"] == [got["grown"], got["baseline"]], got
    assert got["given_back"] > 2**27, got  # the stack of every thread slot of the device: hundreds of MiB at least
    assert got["again"] == got["grown"] and got["same"] and got["replayed"], got
