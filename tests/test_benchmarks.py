"""The GPU benchmark scripts' CPU modes: they must keep running where they are not timed (CI has no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_train_gpu_runs_tiny_presets_on_the_cpu(tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/train_gpu.py", "--device", "cpu", "--scale", "tiny", "--families", "rla", "sgla",
         "--batch", "2", "--seq-len", "64", "--steps", "1", "--warmup", "1", "--profile", "1", "--top-ops", "3", "--glue", "auto", "torch",
         "--inputs", "shared", "separate", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    # --glue auto torch: each linear family with either glue, side by side; --inputs shared separate: the fused glue
    # also with a linear for each reader of an input (the torch glue has only that)
    assert sorted((r["family"], r["glue"]) for r in results) == [
        ("rla", "auto"), ("rla", "auto/separate"), ("rla", "torch"),
        ("sgla", "auto"), ("sgla", "auto/separate"), ("sgla", "torch")]
    rows = {r["family"]: r for r in results if r["glue"] == "auto"}
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["backend"] == "chunk" and r["warmup_s"] >= 0
        assert (r["scale"], r["preset"]) == ("tiny", f"tiny-{r['family']}")
    assert "rla: warm-up step 1/1" in proc.stderr  # progress for the minutes a fresh GPU node spends compiling
    # a CUDA graph needs CUDA: refused up front, not after the CPU rows
    refused = subprocess.run([sys.executable, "benchmarks/train_gpu.py", "--device", "cpu", "--scale", "tiny",
                              "--graph", "off", "on"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--graph on captures CUDA graphs: it needs a CUDA device" in refused.stderr
    assert refused.stdout == ""
    table_row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["tiny-rla", "auto"])
    assert table_row.count("x ") == 3 and "x sep.)" in table_row  # vs base, vs torch glue, vs the separate inputs
    # --profile: a step's time split by kind of op, the GEMMs among them
    for r in rows.values():
        prof = r["profile"]
        assert prof["wall_ms"] > 0 and prof["kinds_ms"]["GEMM"] > 0
        assert sum(prof["kinds_ms"].values()) == pytest.approx(prof["busy_ms"], rel=1e-12)
    assert "tiny-rla: step" in proc.stdout and "GEMM" in proc.stdout.split("tiny-rla: step")[-1]
    # --top-ops: the costliest ops with their input shapes, costliest first, in the JSON and under each profile line
    for r in rows.values():
        top = r["profile"]["top_ops"]
        assert len(top) == 3 and [t["ms"] for t in top] == sorted((t["ms"] for t in top), reverse=True)
        assert all(t["op"].startswith("aten::") and t["shapes"].startswith("[") and t["calls"] > 0 for t in top)
    assert f"x {rows['rla']['profile']['top_ops'][0]['op']} [" in proc.stdout


def test_kernel_kinds():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from train_gpu import kind_of
    finally:
        # left on the path, benchmarks/kernels.py would shadow the `kernels` package transformers imports
        sys.path.remove(str(ROOT / "benchmarks"))

    ours = {"_rla_fwd_pass", "_residual_fwd"}
    assert kind_of("_rla_fwd_pass", ours) == "ours"
    assert kind_of("chunk_fwd_kernel_h", ours) == "FLA"
    assert kind_of("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", ours) == "GEMM"
    assert kind_of("aten::mm", ours) == "GEMM"
    assert kind_of("aten::scatter_add_", ours) == "elementwise, reductions"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, ...>", ours) == "elementwise, reductions"
    assert kind_of("pytorch_flash::flash_fwd_kernel", ours) == "attention"
    assert kind_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel", ours) == "optimizer"


def test_every_scale_of_a_run_in_one_summary():
    """`train_gpu.py --scale 100m 1.5b`: one row per scale (and glue and graph mode), the issue's ratios and MFUs,
    in SHAPES' order whatever the order of the command line; a family that did not run leaves its ratio empty."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from train_gpu import summary_rows
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def row(scale, family, tok_s, mfu, graph=False):
        return dict(scale=scale, family=family, glue="auto", graph=graph, tokens_per_s=tok_s, mfu=mfu)

    rows = [row("1.5b", "rla", 52_098, 0.436), row("1.5b", "sgla", 56_038, 0.462), row("1.5b", "rdn", 46_826, 0.394),
            row("1.5b", "gdn", 54_316, 0.451), row("1.5b", "transformer", 60_000, 0.5),
            dict(scale="1.5b", family="rla", glue="auto", graph=True, error="out of memory"),
            row("100m", "rla", 255_801, 0.195), row("100m", "sgla", 235_934, 0.172),
            row("100m", "rla", 300_000, 0.23, graph=True)]
    got = summary_rows(rows)
    assert [(r["scale"], r["graph"]) for r in got] == [("100m", False), ("100m", True), ("1.5b", False)]
    assert got[0]["rla_vs_sgla"] == pytest.approx(255_801 / 235_934) and got[0]["rdn_vs_gdn"] is None
    assert got[0]["linear_mfu"] == (0.172, 0.195) and got[0]["transformer_mfu"] is None
    assert got[1]["rla_vs_sgla"] is None and got[1]["linear_mfu"] == (0.23, 0.23)
    assert got[2]["rdn_vs_gdn"] == pytest.approx(46_826 / 54_316) and got[2]["linear_mfu"] == (0.394, 0.462)
    assert got[2]["transformer_mfu"] == 0.5


def test_calibrate_keeps_a_graphed_row_beside_the_eager_one(tmp_path):
    """`train_gpu.py --calibrate` replaces a row of the same preset, shape, backend, glue and graph mode: a graphed
    measurement joins the eager row of its preset instead of replacing it, and says it was graphed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from train_gpu import calibrate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from rla_ablate.models import load_preset

    model = load_preset("100m-rla").model_dump(mode="json")
    eager = {"preset": "100m-rla", "model": model, "micro_batch_size": 16, "seq_len": 2048, "tokens_per_s": 1,
             "peak_gib": 20.0, "backend": "triton", "glue": "fused"}
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"device": "Test GPU", "gpu_memory_bytes": 1, "rows": [eager]}))

    def measured(graph, tok_s):
        return dict(family="rla", scale="100m", preset="100m-rla", glue="auto", glue_ran="fused", graph=graph,
                    model=model, batch=16, seq_len=2048, tokens_per_s=tok_s, peak_mem_gib=22.0, backend="triton",
                    warmup_s=1.0)

    args = type("Args", (), {"steps": 6, "warmup": 2})()
    calibrate(str(path), [measured(True, 300_000)], args, "Test GPU | batch 16 x 2048")
    rows = json.loads(path.read_text())["rows"]
    assert [(r["tokens_per_s"], r.get("graph", False)) for r in rows] == [(1, False), (300_000, True)]
    assert "--graph on" in rows[1]["command"]
    calibrate(str(path), [measured(False, 170_000)], args, "Test GPU | batch 16 x 2048")
    rows = json.loads(path.read_text())["rows"]
    assert sorted((r["tokens_per_s"], r.get("graph", False)) for r in rows) == [(170_000, False), (300_000, True)]


def test_sweep_report_sums_the_time_jobs_ran_over_launches():
    """A sweep finished by a `resume` on a later node: its wall time is the time jobs ran, not the gap between the
    launches; a short gap between jobs (a task starting) stays inside one span."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sweep_report import TURNOVER_S, busy_spans, overlap
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = [{"start": 0.0, "end": 100.0}, {"start": 50.0, "end": 200.0}, {"start": 205.0, "end": 300.0},
            {"start": 9000.0, "end": 9200.0}, {"start": 9010.0, "end": 9250.0}, {"start": None, "end": None}]
    assert TURNOVER_S > 5
    assert busy_spans(rows) == [(0.0, 300.0), (9000.0, 9250.0)]
    assert overlap(rows) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_step_captured_in_a_cuda_graph_trains_as_the_eager_step(tmp_path):
    """`train_gpu.py --graph off on`: every family's micro step (forward and backward) captured once and replayed,
    as `train.cuda_graphs` trains, reaches the eager step's loss after the same steps from the same weights and data
    (the same kernels in the same order: rounding apart, the same numbers), and runs."""
    out = tmp_path / "graph.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/train_gpu.py", "--scale", "100m", "--batch", "2", "--seq-len", "256",
         "--steps", "3", "--warmup", "2", "--graph", "off", "on", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    graphed = [r for r in rows if r["graph"]]
    assert sorted(r["family"] for r in graphed) == ["gdn", "rdn", "rla", "sgla", "transformer"]
    for r in graphed:
        assert "error" not in r, r
        assert r["tokens_per_s"] > 0 and r["graph_vs_eager"] <= 1e-3, (r["family"], r["graph_vs_eager"])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_process_memory_attributes_growth_to_each_familys_first_step():
    """`process_memory.py --phases`: one JSON line per phase (the context, a matmul, each family's first step) with
    the memory outside the allocator, its growth and the driver's stack size, which only grows."""
    proc = subprocess.run([sys.executable, "benchmarks/process_memory.py", "--phases", "--families", "sgla", "rla"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["phase"] for r in rows] == ["context", "bf16 matmul", "proxy-lm-sgla step", "proxy-lm-rla step"]
    assert rows[0]["outside_allocator_gib"] > 0
    stacks = [r["stack_bytes_per_thread"] for r in rows]
    assert all(isinstance(s, int) for s in stacks) and stacks == sorted(stacks), stacks


def test_a_kernel_variant_holds_its_settings_over_its_backward(monkeypatch):
    """benchmarks/kernels.py times a variant (`rla_with`: a design switch, a split rule, launch options) forward and
    backward: the backward reads the module's settings when it runs, after the variant's call has returned, so the
    timing holds them over both (`settings_of`); a variant's forward alone left the backward at the defaults."""
    import importlib.util
    from functools import partial

    import torch
    import triton.testing

    from rla_ablate.ops.triton import rla

    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    seen = []

    def forward(q, *args, **kw):  # the op's output, whose backward notes the settings it runs under
        out = q * 1.0
        out.register_hook(lambda grad: seen.append((rla.NARROW_BELOW, rla.SPLIT)) or grad)
        return (out,)

    monkeypatch.setattr(kernels, "residual_attention", forward)
    monkeypatch.setattr(triton.testing, "do_bench", lambda step, **kw: step() or 1.0)
    x = {n: torch.ones(2, requires_grad=True) for n in ("q", "k", "v", "g", "beta", "gamma")}
    rule = rla.SplitRule(programs=1, chunks=1)
    assert kernels.bench(partial(kernels.rla_with, NARROW_BELOW=0, SPLIT=rule), x, "fwd+bwd") == 1.0
    assert seen == [(0, rule)]                                # the timed step's backward
    assert (rla.NARROW_BELOW, rla.SPLIT) == (None, rla.SplitRule())  # restored after


def test_the_shipped_autotune_results_seed_a_triton_cache_keeping_what_is_there(tmp_path, monkeypatch):
    """`seed_triton_cache` (a sweep's launch; benchmarks/kernels.py and train_gpu.py on a GPU): every shipped file
    the cache lacks is copied, a file the cache has is kept as it is, and the count says how many were added;
    `triton_cache_dir` is $TRITON_CACHE_DIR where set."""
    from rla_ablate.sweep.launch import TUNING_SEEDS, seed_this_process, seed_triton_cache, triton_cache_dir

    shipped = sorted(p.relative_to(TUNING_SEEDS) for p in TUNING_SEEDS.rglob("*.autotune.json"))
    assert len(shipped) > 10
    cache = tmp_path / "cache"
    (cache / shipped[0]).parent.mkdir(parents=True)
    (cache / shipped[0]).write_text("this node's own result")
    assert seed_triton_cache(cache) == len(shipped) - 1
    assert (cache / shipped[0]).read_text() == "this node's own result"
    assert (cache / shipped[1]).read_bytes() == (TUNING_SEEDS / shipped[1]).read_bytes()
    assert seed_triton_cache(cache) == 0
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert triton_cache_dir() == cache
    # the benchmarks' seeding (`seed_this_process`): a line when it added files, None when there was nothing to add
    assert seed_this_process() is None
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh"))
    assert seed_this_process() == f"autotune results: {len(shipped)} shipped files added to the Triton cache at " \
                                  f"{tmp_path / 'fresh'}"
