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
    f = Path(tempfile.mkdtemp(prefix="gpu-every-job")) / "sweep.yaml"
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
    assert backend == ("sdpa" if sweep_job.family == "transformer" else "triton"), backend
    peaks = [r["values"]["train/peak_mem_gib"] for r in records if r["type"] == "metrics"
             and "train/peak_mem_gib" in r["values"]]
    assert peaks and peaks[-1] > 0
