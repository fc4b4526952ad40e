"""The GPU memory estimate and the packing it drives: the arithmetic of rla_ablate.sweep.calibration on a table
written here, the shares `resources.gpus: auto` asks Ray for, and the launch-time refusal of a share that cannot
hold its job (file, line, key)."""

from __future__ import annotations

import math
from collections import deque
import textwrap

import pytest

from rla_ablate import environment
from rla_ablate.errors import UserError
from rla_ablate.models import count_params, load_preset
from rla_ablate.sweep import calibration as C
from rla_ablate.sweep.expand import load_sweep
from rla_ablate.sweep.packing import jobs_per_gpu, place
from rla_ablate.train import JobConfig

GPU = 140 * C.GiB


def job(preset: str, mb: int = 16, seq: int = 2048, **model) -> JobConfig:
    cfg = load_preset(preset).model_copy(update=model)
    return JobConfig.model_validate({"model": cfg.model_dump(), "data": {"kind": "stdlib"},
                                     "train": {"micro_batch_size": mb, "seq_len": seq, "batch_tokens": mb * seq,
                                               "tokens": 10 * mb * seq}})


def row(preset: str, peak: float, tok_s: float, mb: int = 16, seq: int = 2048, **model) -> dict:
    cfg = load_preset(preset).model_copy(update=model)
    # measured with the kernels as they are (RLA keeping x's slope; an RDN row says nothing: a test sets it)
    return {"preset": preset, "model": cfg.model_dump(mode="json"), "micro_batch_size": mb, "seq_len": seq,
            "peak_gib": peak, "tokens_per_s": tok_s, "backend": "triton", "rla_x_slope": True}


@pytest.fixture
def table(monkeypatch):
    """Replace the shipped table by rows chosen here."""
    rows: list[dict] = []

    def fake(name=C.TABLE):
        return {"device": "test GPU", "gpu_memory_bytes": GPU, "rows": rows}

    for cached in (C._rows, C._coefficients):
        cached.cache_clear()
    monkeypatch.setattr(C, "load_table", fake)
    yield rows
    for cached in (C._rows, C._coefficients):
        cached.cache_clear()


def test_a_calibration_row_is_reproduced_exactly(table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    est = C.estimate_memory(job("100m-rla"))
    assert est.gib == pytest.approx(44.6, rel=1e-6)
    P = count_params(load_preset("100m-rla"))
    # fp32 weights, gradients, AdamW's two moments and autocast's bf16 copies
    assert (est.weights, est.grads, est.optimizer, est.autocast_copies) == (4 * P, 4 * P, 8 * P, 2 * P)
    assert est.loss == 16 * 2048 * C.GLUE_BYTES["torch"][1] * 32000 and est.glue == "torch"


def test_rdn_rows_measured_before_its_auxiliary_pass_kept_its_states_get_their_bytes(table):
    """RDN's auxiliary pass keeps h, v_new and w for its backward: 8 bytes a token and layer per unit of width at
    head_dim 128 (measured on an H100: +1,024 MiB held at 65,536 tokens, 16 heads of 128). A row without
    `rdn_states_kept` was measured without them, so its estimate adds them; a row with it is reproduced exactly."""
    rdn = load_preset("100m-rdn")
    assert C.kept_state_bytes(rdn) == 8 * C.mixer_width(rdn)
    assert C.kept_state_bytes(rdn.replace(fit="none")) == 0  # no auxiliary recurrence
    assert C.kept_state_bytes(load_preset("100m-gdn")) == 0 and C.kept_state_bytes(load_preset("100m-rla")) == 0
    table.append(row("100m-rdn", peak=30.0, tok_s=150_000))
    n_layers = 16 * 2048 * rdn.num_layers
    assert C.estimate_memory(job("100m-rdn")).gib * C.GiB == pytest.approx(30.0 * C.GiB + n_layers * 8 * 768)
    table[0]["rdn_states_kept"] = True
    C._rows.cache_clear()
    C._coefficients.cache_clear()
    assert C.estimate_memory(job("100m-rdn")).gib == pytest.approx(30.0, rel=1e-6)
    table[:] = [row("100m-gdn", peak=30.0, tok_s=150_000)]  # other families are measured as they run
    C._rows.cache_clear()
    C._coefficients.cache_clear()
    assert C.estimate_memory(job("100m-gdn")).gib == pytest.approx(30.0, rel=1e-6)


def test_rla_rows_measured_while_its_forward_kept_x_lose_those_bytes(table):
    """RLA's forward keeps of x = v - p only what its target's slope needs (a byte for the clip, x in fp32 for tanh,
    nothing for the identity) where it kept x in fp32: a row without `rla_x_slope` held 3 bytes a token and layer
    per unit of width more (clip), which its estimate takes away; a row with it is reproduced exactly."""
    rla = load_preset("100m-rla")
    assert rla.target == "clip" and C.dropped_x_bytes(rla) == 3 * C.mixer_width(rla)
    assert C.dropped_x_bytes(rla.replace(target="identity")) == 4 * C.mixer_width(rla)
    assert C.dropped_x_bytes(rla.replace(target="tanh")) == 0
    assert C.dropped_x_bytes(load_preset("100m-rdn")) == 0 and C.dropped_x_bytes(load_preset("100m-sgla")) == 0
    table.append(row("100m-rla", peak=30.0, tok_s=150_000))
    del table[0]["rla_x_slope"]
    n_layers = 16 * 2048 * rla.num_layers
    assert C.estimate_memory(job("100m-rla")).gib * C.GiB == pytest.approx(30.0 * C.GiB - n_layers * 3 * 768)
    table[0]["rla_x_slope"] = True
    C._rows.cache_clear()
    C._coefficients.cache_clear()
    assert C.estimate_memory(job("100m-rla")).gib == pytest.approx(30.0, rel=1e-6)


def test_a_family_with_fused_glue_rows_is_estimated_from_them_alone(table):
    """Rows measured with FLA's fused glue (smaller MLP and loss terms) replace the family's plain-torch rows, for
    memory and speed alike; another family keeps its torch rows."""
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-sgla", peak=38.9, tok_s=181_000))
    table.append(row("100m-rla", peak=31.0, tok_s=230_000) | {"glue": "fused"})
    est = C.estimate_memory(job("100m-rla"))
    assert est.gib == pytest.approx(31.0, rel=1e-6) and est.glue == "fused"
    assert est.loss == 16 * 2048 * C.GLUE_BYTES["fused"][1] * 32000
    assert C.estimate_speed(job("100m-rla"), 400).tokens_per_s == pytest.approx(230_000)
    # read with the torch glue's bytes, the same peak leaves less to the activations: a_f depends on the row's glue
    assert C.row_a_f(table[2], load_preset("100m-rla")) > C.row_a_f(table[2] | {"glue": "torch"}, load_preset("100m-rla"))
    assert C.estimate_memory(job("100m-sgla")).glue == "torch"
    assert C.estimate_memory(job("100m-sgla")).gib == pytest.approx(38.9, rel=1e-6)


def test_a_width_never_measured_with_the_fused_glue_keeps_its_torch_coefficient(table):
    """A family measured fused at 100m only: a 1.5B job takes the 1.5B plain-torch row's a_f (with the fused glue's
    MLP and loss bytes), not the narrower width's smaller fused a_f; between the widths it interpolates."""
    table.append(row("1.5b-rla", peak=98.7, tok_s=33_000, mb=4, seq=4096))
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-rla", peak=21.7, tok_s=255_000) | {"glue": "fused"})
    big, small = load_preset("1.5b-rla"), load_preset("100m-rla")
    est = C.estimate_memory(job("1.5b-rla", mb=4, seq=4096))
    assert est.glue == "fused" and est.a_f == pytest.approx(C.row_a_f(table[0], big))
    assert est.source == "1.5b-rla (torch glue)"
    # under the torch row's peak by the fused glue's MLP and loss savings alone
    saved = 4 * 4096 * (big.num_layers * 2 * big.intermediate_size + 10 * big.vocab_size)
    assert est.total == pytest.approx(98.7 * C.GiB - saved, rel=1e-6)
    assert C.estimate_memory(job("100m-rla")).gib == pytest.approx(21.7, rel=1e-6)
    mid = C.estimate_memory(job("100m-rla", hidden_size=1024, num_heads=8))
    assert C.row_a_f(table[2], small) < mid.a_f < C.row_a_f(table[0], big) and " .. " in mid.source
    # speeds alike: the 1.5B job's from its torch row (the families' ratio there, as wall-clock controls need)
    assert C.estimate_speed(job("1.5b-rla", mb=4, seq=4096), 400).tokens_per_s == pytest.approx(33_000)


def test_jobs_told_to_run_the_torch_glue_are_estimated_from_its_rows(table, monkeypatch):
    """RLA_GLUE=torch: the plain loss holds ~6x the fused one's bytes; its rows, or the fused rows' coefficients
    with the torch glue's bytes, estimate the job (a packed job's cap is its estimate)."""
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-rla", peak=31.0, tok_s=230_000) | {"glue": "fused"})
    table.append(row("100m-sgla", peak=27.0, tok_s=250_000) | {"glue": "fused"})
    monkeypatch.setenv("RLA_GLUE", "torch")
    est = C.estimate_memory(job("100m-rla"))
    assert est.glue == "torch" and est.gib == pytest.approx(44.6, rel=1e-6)
    assert C.estimate_speed(job("100m-rla"), 400).tokens_per_s == pytest.approx(165_000)
    only_fused = C.estimate_memory(job("100m-sgla"))
    assert only_fused.glue == "torch" and only_fused.gib > 27.0 + 9  # + (12 - 2) x 32K tokens x 32K vocab


def test_activations_scale_with_the_micro_batch_and_fsdp_shards_the_static_part(table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    one, four = C.estimate_memory(job("100m-rla", mb=4)), C.estimate_memory(job("100m-rla", mb=16))
    assert four.activations + four.loss == pytest.approx(4 * (one.activations + one.loss), rel=1e-9)
    assert four.weights == one.weights
    sharded = job("100m-rla").model_copy(deep=True)
    sharded.train.__dict__.update(num_workers=4, fsdp=True)
    est = C.estimate_memory(sharded)
    assert est.weights * 4 == four.weights and est.optimizer * 4 == four.optimizer


def test_a_graphed_job_is_estimated_with_its_graph_pool(table):
    """train.cuda_graphs: the graph's pool is held beyond the eager peak (GRAPH_EXTRA of it, measured 11-20%, the
    largest of them below GRAPH_EXTRA), so
    the estimate, and the share `gpus: auto` asks for, grow by it."""
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    eager = C.estimate_memory(job("100m-rla"))
    graphed_job = job("100m-rla").model_copy(deep=True)
    graphed_job.train.__dict__.update(cuda_graphs=True)
    graphed = C.estimate_memory(graphed_job)
    assert eager.graph_pool == 0 and eager.total == pytest.approx(44.6 * C.GiB, rel=1e-6)
    assert graphed.graph_pool == int(C.GRAPH_EXTRA * eager.total)
    assert graphed.total == eager.total + graphed.graph_pool
    assert C.gpu_share(graphed, GPU, 0.15) > C.gpu_share(eager, GPU, 0.15)
    assert graphed.as_dict()["graph_pool"] == graphed.graph_pool
    assert C.GRAPH_EXTRA > 0.202  # the 100M Transformer's graphed reserved peak was 20.2% over its eager peak
    # at a proxy's size the pool's allocator segments are most of the peak: it is at least GRAPH_POOL_MIN
    tiny = job("proxy-mqar-rdn", mb=16, seq=64).model_copy(deep=True)
    tiny.train.__dict__.update(cuda_graphs=True)
    small = C.estimate_memory(tiny)
    assert small.graph_pool == C.GRAPH_POOL_MIN > C.GRAPH_EXTRA * (small.total - small.graph_pool)
    assert small.gib > 0.43  # the largest graphed MQAR reserved peak measured (H100)


def test_coefficient_interpolates_in_log_width_and_clamps_outside(table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("1.5b-rla", peak=98.7, tok_s=33_452, mb=4, seq=4096))
    lo = C.row_a_f(table[0], load_preset("100m-rla"))
    hi = C.row_a_f(table[1], load_preset("1.5b-rla"))
    assert lo != pytest.approx(hi)
    mid = job("100m-rla", hidden_size=1024, num_heads=8)  # width 1024 between 768 and 2048
    t = (math.log(1024) - math.log(768)) / (math.log(2048) - math.log(768))
    assert C.estimate_memory(mid).a_f == pytest.approx(lo + t * (hi - lo))
    assert C.estimate_memory(job("tiny-rla")).a_f == pytest.approx(lo)
    # a family without rows takes the largest calibrated coefficient: the estimate errs high
    assert C.estimate_memory(job("100m-gdn")).a_f == pytest.approx(max(lo, hi))


def test_matched_state_control_needs_more_memory_than_its_baseline(table):
    table.append(row("100m-sgla", peak=38.9, tok_s=181_000))
    wide = job("100m-sgla", expand_v=2.0)
    assert C.estimate_memory(wide).total > C.estimate_memory(job("100m-sgla")).total


def test_speed_from_measured_flops_and_never_faster_below_the_narrowest_row_nor_as_fast_deeper(table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("1.5b-rla", peak=98.7, tok_s=33_452, mb=4, seq=4096))
    assert C.estimate_speed(job("100m-rla"), 400).tokens_per_s == pytest.approx(165_000)
    assert C.estimate_speed(job("tiny-rla"), 400).tokens_per_s == pytest.approx(165_000)
    s = C.estimate_speed(job("100m-gdn"), 400)
    assert s.source == "assumed 400 TFLOP/s"
    # a narrow model deeper than the row launches more kernels a step: 48 layers against the row's 12
    deep = C.estimate_speed(job("tiny-rla", num_layers=48), 400)
    assert deep.tokens_per_s == pytest.approx(165_000 / 4) and deep.source.endswith("deeper: fewer tokens/s")


def test_graphed_rows_give_graphed_jobs_their_speed_and_no_memory_coefficient(table):
    """A row measured with CUDA graphs (`train_gpu.py --graph on --calibrate`): a graphed job's speed comes from it,
    an eager job's never; its peak (the reserved peak, pool included) never becomes a memory coefficient. A graphed
    job of a family without graphed rows takes the eager rows."""
    table.append(row("100m-rla", peak=21.7, tok_s=165_000))
    eager_estimate = C.estimate_memory(job("100m-rla"))
    table.append(dict(row("100m-rla", peak=40.0, tok_s=300_000), graph=True))
    table.append(row("100m-sgla", peak=17.2, tok_s=180_000))
    for cached in (C._rows, C._coefficients):
        cached.cache_clear()
    graphed = job("100m-rla").model_copy(deep=True)
    graphed.train.__dict__.update(cuda_graphs=True)
    assert C.estimate_memory(job("100m-rla")) == eager_estimate
    assert C.estimate_speed(job("100m-rla"), 400).tokens_per_s == pytest.approx(165_000)
    speed = C.estimate_speed(graphed, 400)
    assert speed.tokens_per_s == pytest.approx(300_000) and "CUDA graph" in speed.source
    sgla = job("100m-sgla").model_copy(deep=True)
    sgla.train.__dict__.update(cuda_graphs=True)
    assert C.estimate_speed(sgla, 400).tokens_per_s == pytest.approx(180_000)
    # per width: a graphed 1.5B job takes the 1.5B eager row, not the 100M graphed row's FLOP/s
    table.append(row("1.5b-rla", peak=59.6, tok_s=49_000, mb=4, seq=4096))
    for cached in (C._rows, C._coefficients):
        cached.cache_clear()
    big = job("1.5b-rla", mb=4, seq=4096).model_copy(deep=True)
    big.train.__dict__.update(cuda_graphs=True)
    assert C.estimate_speed(big, 400).tokens_per_s == pytest.approx(49_000)
    assert C.estimate_speed(graphed, 400).tokens_per_s == pytest.approx(300_000)


def test_matched_wallclock_budgets_price_gpu_time(tmp_path, table):
    """The wall-clock control's budget comes from rows measured with CUDA graphs where the table has them, whether or
    not the sweep's jobs replay graphs: eager, a host-bound 100M step favours the family with fewer launches (here
    RLA, as measured: 255.8K against sGLA's 235.9K on an H200), graphed the GPU's time is priced (sGLA 347K against
    RLA 302K on an H100). Without graphed rows the eager ones serve."""
    f = tmp_path / "wc.yaml"
    f.write_text(textwrap.dedent("""
        name: wc
        models: [{preset: 100m-rla}]
        base:
          train: {tokens: 1000000, seq_len: 2048, batch_tokens: 32768, micro_batch_size: 16}
          data: {kind: stdlib}
        controls: [matched_wallclock]
    """))

    def budget():
        C._rows.cache_clear()
        control = next(j for j in load_sweep(f).jobs if j.control == "matched_wallclock")
        assert not control.job.train.cuda_graphs
        return control.job.train.tokens, control.control_report

    table.append(row("100m-rla", peak=21.7, tok_s=255_800))
    table.append(row("100m-sgla", peak=19.0, tok_s=235_900))
    tokens, report = budget()
    assert tokens == math.ceil(1_000_000 * 235_900 / 255_800) < 1_000_000
    assert "CUDA graph" not in report["speed_source"]
    table.append(dict(row("100m-rla", peak=24.3, tok_s=301_800), graph=True))
    table.append(dict(row("100m-sgla", peak=21.0, tok_s=347_000), graph=True))
    tokens, report = budget()
    assert tokens == math.ceil(1_000_000 * 347_000 / 301_800) > 1_000_000
    assert report["speed_ratio"] == pytest.approx(347_000 / 301_800)
    assert "CUDA graph" in report["speed_source"] and "CUDA graph" in report["reference_speed_source"]


def write_sweep(tmp_path, resources: str, mb: int = 16) -> object:
    f = tmp_path / "s.yaml"
    f.write_text(textwrap.dedent(f"""
        name: pack
        models: [{{preset: 100m-rla}}, {{preset: 100m-sgla}}]
        base:
          train: {{tokens: 1000000, seq_len: 2048, batch_tokens: {mb * 2048}, micro_batch_size: {mb}}}
          data: {{kind: stdlib}}
        resources: {resources}
    """))
    return load_sweep(f)


def test_auto_packs_by_estimate_with_margin_and_context(tmp_path, table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-sgla", peak=38.9, tok_s=181_000))
    sweep = write_sweep(tmp_path, "{gpus: auto, memory_margin: 0.1}")
    placed = place(sweep, GPU)
    by_family = {j.family: placed[j.job_id] for j in sweep.jobs}
    for fam, peak in (("rla", 44.6), ("sgla", 38.9)):
        p = by_family[fam]
        usable = GPU - C.DRIVER_RESERVED_BYTES - C.TUNING_BYTES  # the one autotuning process's room stays free
        assert p.gpus == pytest.approx(math.ceil((peak * C.GiB * 1.1 + C.CONTEXT_BYTES) / usable * 100) / 100)
        # the allocator's cap leaves the context outside and still holds the estimate plus margin
        assert p.cap * GPU >= peak * C.GiB * 1.1 - 1e-6
        assert p.cap < p.gpus
    # caps plus contexts of jobs whose shares add up to one GPU never exceed what processes can allocate less one
    # autotuning process's room
    assert C.usable_bytes(GPU) == GPU - C.DRIVER_RESERVED_BYTES - C.TUNING_BYTES
    assert sum(p.cap * GPU + C.CONTEXT_BYTES for p in placed.values()) <= \
        sum(p.gpus for p in placed.values()) * C.usable_bytes(GPU) + 1e-3
    # 0.36 + 0.31: three jobs of these fit on one GPU at once
    assert 2.5 < jobs_per_gpu(placed) < 3.5
    assert all(p.gpus == 0 and p.cap is None for p in place(sweep, None).values())  # no GPU: CPU


def test_auto_refuses_a_job_larger_than_a_gpu(tmp_path, table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    sweep = write_sweep(tmp_path, "{gpus: auto}", mb=64)
    with pytest.raises(UserError) as exc:
        place(sweep, GPU)
    e = exc.value
    assert e.key == "resources.gpus" and e.line == 7 and str(e.file).endswith("s.yaml")
    assert "micro_batch_size" in str(e)


def test_an_explicit_share_too_small_for_its_job_is_refused(tmp_path, table):
    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-sgla", peak=38.9, tok_s=181_000))
    with pytest.raises(UserError) as exc:
        place(write_sweep(tmp_path, "{gpus: 0.25}"), GPU)
    assert exc.value.key == "resources.gpus" and exc.value.line == 7
    need = C.gpu_share(C.estimate_memory(job("100m-rla")), GPU, 0.15)  # the default margin
    assert "100m-rla" in str(exc.value) and f"gpus: {need:.2f}" in str(exc.value)
    ok = place(write_sweep(tmp_path, "{gpus: 0.5}"), GPU)
    usable = C.usable_bytes(GPU)
    assert all(p.gpus == 0.5 and p.cap == pytest.approx((0.5 * usable - C.CONTEXT_BYTES) / GPU) for p in ok.values())
    whole = place(write_sweep(tmp_path, "{gpus: 1}"), GPU)
    assert all(p.gpus == 1 and p.cap is None for p in whole.values())


def test_the_shipped_table_is_valid():
    C._rows.cache_clear()
    C._coefficients.cache_clear()
    rows = C._rows()
    assert rows and all(r["peak_gib"] > 0 and (r["tokens_per_s"] is None or r["tokens_per_s"] > 0) for r, _ in rows)
    families = {"rla", "rdn", "sgla", "gdn", "transformer"}
    assert {m.family for _, m in rows} == families
    # every family has a row measured alone, which GPU-hours come from
    assert {m.family for r, m in rows if r["tokens_per_s"]} == families
    # Every measured shape is estimated at or above its peak: a width's largest coefficient wins, so the job that
    # peaked highest of its shape fits its share (a packed job's cap is its share).
    # Each row against the estimate for jobs of its glue (a plain-torch row under RLA_GLUE=torch), less what an RLA
    # row measured while its forward kept x no longer holds.
    for r, m in rows:
        shape = job("tiny-rla", mb=r["micro_batch_size"], seq=r["seq_len"]).model_copy(update={"model": m})
        tokens = r["micro_batch_size"] * r["seq_len"]
        dropped = 0 if r.get("rla_x_slope") else tokens * m.num_layers * C.dropped_x_bytes(m)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(environment.GLUE_ENV, "torch" if C.row_glue(r) == "torch" else "auto")
            assert C.estimate_memory(shape).total >= (r["peak_gib"] * C.GiB - dropped) * (1 - 1e-9), \
                (r["preset"], r.get("glue"))


def test_on_gpus_a_fixed_sweep_starts_its_longest_jobs_first(tmp_path, table):
    """Tokens left over the estimated tokens/s: the slower family first, a job half done after a fresh one; on the
    CPU (no GPU share) the expansion order stays."""
    from rla_ablate.sweep.launch import order_longest_first
    from rla_ablate.sweep.sources import GridSource
    from rla_ablate.sweep.state import SweepDir

    table.append(row("100m-rla", peak=44.6, tok_s=165_000))
    table.append(row("100m-sgla", peak=38.9, tok_s=100_000))
    sweep = write_sweep(tmp_path, "{gpus: auto}")
    sdir = SweepDir(tmp_path / "runs", sweep.name)

    class Notes:
        said: list[str] = []

        def note(self, text):
            self.said.append(text)

    def queued(placements):
        source = GridSource(sweep, sdir)
        source.queue = deque(source.jobs)
        order_longest_first(sweep, sdir, source, placements, Notes())
        return [j.name.split("/")[0] for j in source.queue]

    assert queued(place(sweep, None)) == ["100m-rla", "100m-sgla"] and not Notes.said
    assert queued(place(sweep, GPU)) == ["100m-sgla", "100m-rla"] and "longest first" in Notes.said[0]
    sgla = next(j for j in sweep.jobs if j.name.startswith("100m-sgla"))
    sdir.job_dir(sgla.job_id).mkdir(parents=True)
    sdir.set_status(sgla.job_id, tokens_done=600_000)  # 0.4M left at 100K/s against 1M at 165K/s
    assert queued(place(sweep, GPU)) == ["100m-rla", "100m-sgla"]
