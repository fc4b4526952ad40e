"""The fused RLA kernels (rla_ablate/ops/triton/rla.py) on CPU, through Triton's interpreter (TRITON_INTERPRET=1).

The interpreter must be chosen before the kernels are defined, so the checks run in a fresh process (this file as
a script). fp32 kernels against the float64 naive contract on the same inputs: outputs, final states and all eight
gradients (dg comes from the reverse-cumsum identity, the least obvious part). A chunk of 16 tokens makes T=37 span
three chunks, the last one partial; clip=0.7 puts many residuals outside the clip. Then packed sequences of uneven
lengths (one of a single token, one empty), K and V that are not powers of two (masked tiles) and wider than
one tile (K=80, V=72: partial sums over tiles), gates of -1e5 and -300, and a call without initial states. Then
every state pass split into segments (`run_state_pass`, forced down to one and two chunks a segment), batched and
packed, the forward with its residuals in a kernel of their own rather than in S's pass, and dg's chunk end terms
from the dq/dk kernel rather than the reverse state passes. Measured: every error <= 1.1e-6 (relative RMS),
tolerance 1e-5.
"""

from __future__ import annotations

import itertools
import re

import pytest

pytest.importorskip("triton")

RATIO, ATOL = 1e-5, 1e-6


def check_gate_gradient(compare) -> None:
    """`common.gate_gradient` (one program a chunk and head) against its sums in float64: packed sequences of 5, 0,
    1 and 9 tokens in chunks of 4 (each sequence's last chunk partial), two K tiles of partials, three rows of end
    terms, with and without the `plus` and `extra` terms."""
    import torch

    from rla_ablate.ops.triton.common import Layout, gate_gradient

    H, NK, sizes = 3, 2, (4, 1, 1, 4, 4, 1)
    layout = Layout(1, 15, torch.tensor([0, 5, 5, 6, 15]), chunk=4, device="cpu")
    gen = torch.Generator().manual_seed(11)
    reads, plus, minus = (torch.randn(NK, 15 * H, generator=gen) for _ in range(3))
    extra = torch.randn(15 * H, generator=gen)
    Z_P = torch.randn(3, layout.chunks * H, generator=gen)
    for with_plus, with_extra in ((True, False), (False, True)):
        r = reads.double().sum(0).view(15, H)
        terms = r - minus.double().sum(0).view(15, H)
        terms += plus.double().sum(0).view(15, H) if with_plus else 0
        terms += extra.double().view(15, H) if with_extra else 0
        Z = Z_P.double().sum(0).view(-1, H)
        want, start = [], 0
        for c, size in enumerate(sizes):
            part = terms[start:start + size]
            want += [part[t:].sum(0) - r[start + t] + Z[c] for t in range(size)]
            start += size
        got = gate_gradient(layout, reads, minus, Z_P, H, 4, plus=plus if with_plus else None,
                            extra=extra if with_extra else None)
        compare(f"gate-gradient-{'plus' if with_plus else 'extra'}", {"dg": torch.stack(want)}, {"dg": got})


def check_all() -> None:
    import torch
    from interpreter_checks import Comparer, check_packed, make, run

    from rla_ablate.ops.naive import naive_residual_attention
    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.rla import rla_triton

    compare = Comparer(RATIO, ATOL)
    check_gate_gradient(compare)

    for fit, target, og in itertools.product(["residual", "none"], ["clip", "tanh", "identity"], [True, False]):
        spec = ResidualSpec(rule="additive", fit=fit, target=target, output_gates=og, clip=0.7)
        master = make()
        compare(f"{fit}-{target}-{'gates' if og else 'nogates'}", run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))

    check_packed(compare, "additive", rla_triton, chunk=16)

    for fit in ("residual", "none"):  # heads wider than one tile: K and V split over programs, partial sums added
        spec = ResidualSpec(rule="additive", fit=fit, clip=0.7)
        master = make(B=1, T=37, H=1, K=80, V=72)
        compare(f"wide-{fit}", run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))

    spec = ResidualSpec(rule="additive")
    master = make(T=50)
    compare("no-initial-state", run(naive_residual_attention, master, spec, torch.float64, with_state=False),
            run(rla_triton, master, spec, torch.float32, with_state=False, chunk=16))

    # Long sequences on few programs: every state pass (S, R forward; dR, dS backward) cut into segments that run
    # side by side, forced here down to one or two chunks a segment
    import rla_ablate.ops.triton.rla as fused
    from interpreter_checks import per_sequence_reference

    for per in (1, 2):
        fused.SPLIT = fused.SplitRule(programs=10**9, chunks=per)
        for fit, with_state in (("residual", True), ("none", True), ("residual", False)):
            spec = ResidualSpec(rule="additive", fit=fit, clip=0.7)
            master = make(T=70)
            compare(f"split{per}-{fit}{'' if with_state else '-no-initial-state'}",
                    run(naive_residual_attention, master, spec, torch.float64, with_state=with_state),
                    run(rla_triton, master, spec, torch.float32, with_state=with_state, chunk=16))
    # packed: sequences of one to four segments, gates of -1e5 and -300 inside the segments' decays
    lengths = [20, 1, 64, 16, 9]
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    spec = ResidualSpec(rule="additive", clip=0.7)
    master = make(B=1, T=sum(lengths), K=24, V=20, N=len(lengths))
    master["g"][0, 30, 0], master["g"][0, 60, 1] = -1e5, -300.0
    compare("split1-packed", per_sequence_reference(master, spec, cu),
            run(rla_triton, master, spec, torch.float32, cu_seqlens=cu, chunk=16))
    # the forward with its residuals in a kernel of their own (`_fwd_residual`), which benchmarks/kernels.py times
    # against S's pass making them: split and unsplit
    fused.RESIDUAL_IN_S_PASS = False
    for per in (1, 2):
        fused.SPLIT = fused.SplitRule(programs=10**9 if per == 1 else 0, chunks=1)
        spec = ResidualSpec(rule="additive", clip=0.7)
        master = make(T=50)
        compare(f"residual-apart{'-split' if per == 1 else ''}",
                run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))
    fused.RESIDUAL_IN_S_PASS = True
    fused.SPLIT = fused.SplitRule()
    # dg's chunk end terms from the stored state tiles in the dq/dk kernel (`Z_STATES`), which benchmarks/kernels.py
    # times against the reverse state passes storing them: gates, no gates, fit none, and tiles narrower than K, V
    fused.END_TERM_IN_PASS = False
    for fit, og, dims in (("residual", True, {}), ("residual", False, {}), ("none", True, {}),
                          ("residual", True, dict(B=1, H=1, K=80, V=72))):
        spec = ResidualSpec(rule="additive", fit=fit, output_gates=og, clip=0.7)
        master = make(T=50, **dims)
        compare(f"end-term-in-dqk-{fit}-{'gates' if og else 'nogates'}{'-wide' if dims else ''}",
                run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))
    fused.END_TERM_IN_PASS = True
    # the state passes at MIN_TILE x MIN_TILE tiles (`NARROW_BELOW`: a pass with fewer than two programs per SM):
    # heads wider than one tile, so that both kinds of pass change tiles, and dg's end terms as many rows as tiles;
    # with the end terms from the dq/dk kernel too
    fused.NARROW_BELOW = 10**9
    for fit, in_pass in (("residual", True), ("none", True), ("residual", False)):
        fused.END_TERM_IN_PASS = in_pass
        spec = ResidualSpec(rule="additive", fit=fit, clip=0.7)
        master = make(B=1, T=37, H=1, K=80, V=72)
        compare(f"narrow-{fit}{'' if in_pass else '-end-term-in-dqk'}",
                run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))
    fused.END_TERM_IN_PASS = True
    lengths = [20, 1, 35, 0, 9]  # packed, uneven, one empty: the narrow tiles over several sequences
    cu = torch.tensor([0, *itertools.accumulate(lengths)])
    spec = ResidualSpec(rule="additive", clip=0.7)
    master = make(B=1, T=sum(lengths), H=1, K=80, V=72, N=len(lengths))
    compare("narrow-packed", per_sequence_reference(master, spec, cu),
            run(rla_triton, master, spec, torch.float32, cu_seqlens=cu, chunk=16))
    fused.NARROW_BELOW = None
    # the state passes making their gates in their loop (`GATES_MADE_ONCE` off), which benchmarks/kernels.py times
    # against the gates made once: unsplit and split, and packed with an empty sequence and huge gates
    fused.GATES_MADE_ONCE = False
    for fit, og, per in (("residual", True, None), ("none", False, None), ("residual", True, 1)):
        fused.SPLIT = fused.SplitRule(programs=10**9, chunks=per) if per else fused.SplitRule()
        spec = ResidualSpec(rule="additive", fit=fit, output_gates=og, clip=0.7)
        master = make(T=37)
        compare(f"gates-in-pass-{fit}-{'gates' if og else 'nogates'}{'-split' if per else ''}",
                run(naive_residual_attention, master, spec, torch.float64),
                run(rla_triton, master, spec, torch.float32, chunk=16))
    fused.SPLIT = fused.SplitRule()
    check_packed(compare, "additive", rla_triton, prefix="gates-in-pass-", chunk=16)
    fused.GATES_MADE_ONCE = True
    # the state passes' reads one chunk ahead (`READ_AHEAD`) in every pass: all but the key tiles, and all
    default_ahead = fused.READ_AHEAD
    for ahead in (1, 2):
        fused.READ_AHEAD = ahead
        for fit, og, per in (("residual", True, None), ("none", False, 1)):
            fused.SPLIT = fused.SplitRule(programs=10**9, chunks=per) if per else fused.SplitRule()
            spec = ResidualSpec(rule="additive", fit=fit, output_gates=og, clip=0.7)
            compare(f"ahead{ahead}-{fit}-{'gates' if og else 'nogates'}{'-split' if per else ''}",
                    run(naive_residual_attention, make(T=37), spec, torch.float64),
                    run(rla_triton, make(T=37), spec, torch.float32, chunk=16))
        fused.SPLIT = fused.SplitRule()
        check_packed(compare, "additive", rla_triton, prefix=f"ahead{ahead}-", chunk=16)
        # empty sequences first and last: a pass reads ahead of a sequence that has no chunk, at the buffers' ends
        cu = torch.tensor([0, 0, 21, 21])
        master = make(B=1, T=21, N=3)
        compare(f"ahead{ahead}-empty-ends", per_sequence_reference(master, spec, cu),
                run(rla_triton, master, spec, torch.float32, cu_seqlens=cu, chunk=16))
    # each pass reading ahead as a rule picks for its kind (`AheadRule`: R's and dR's passes 1, dS's 2, S's 0)
    fused.READ_AHEAD = fused.AheadRule(most=10**9)
    for per in (None, 1):
        fused.SPLIT = fused.SplitRule(programs=10**9, chunks=per) if per else fused.SplitRule()
        spec = ResidualSpec(rule="additive", fit="residual", output_gates=True, clip=0.7)
        compare(f"ahead-rule{'-split' if per else ''}", run(naive_residual_attention, make(T=37), spec, torch.float64),
                run(rla_triton, make(T=37), spec, torch.float32, chunk=16))
    fused.SPLIT = fused.SplitRule()
    fused.READ_AHEAD = default_ahead
    # dg's end terms stored a row per row of each state tile and added by the gate-gradient kernel (`END_TERM_ROWS`):
    # unsplit and split, tiles narrower than the state (K=80, V=72), packed
    fused.END_TERM_ROWS = True
    for fit, og, per in (("residual", True, None), ("none", False, 1)):
        fused.SPLIT = fused.SplitRule(programs=10**9, chunks=per) if per else fused.SplitRule()
        spec = ResidualSpec(rule="additive", fit=fit, output_gates=og, clip=0.7)
        compare(f"end-term-rows-{fit}-{'gates' if og else 'nogates'}{'-split' if per else ''}",
                run(naive_residual_attention, make(T=37, K=80, V=72), spec, torch.float64),
                run(rla_triton, make(T=37, K=80, V=72), spec, torch.float32, chunk=16))
    fused.SPLIT = fused.SplitRule()
    check_packed(compare, "additive", rla_triton, prefix="end-term-rows-", chunk=16)
    fused.END_TERM_ROWS = False
    check_carry(compare)


def check_carry(compare) -> None:
    """`_segment_carry` against the sequential recurrence over segments, forward and reverse, with and without an
    initial state: start_s = D, then D <- exp(LD[s]) D + E[s]; tiles narrower than the state (K=80, V=72)."""
    import torch

    from rla_ablate.ops.triton.rla import segment_carry

    first = torch.tensor([0, 2, 3, 6, 7], dtype=torch.int32)  # sequences of 2, 1, 3, 1 segments
    H, K, V, S, N = 2, 80, 72, 7, 4
    gen = torch.Generator().manual_seed(3)
    E, D0 = torch.randn(S, H, V, K, generator=gen), torch.randn(N, H, V, K, generator=gen)
    LD = -3 * torch.rand(S, H, generator=gen)
    LD[4, 1] = -1e5 * 60  # a decay that underflows to zero
    for reverse, with_d0 in itertools.product((False, True), (True, False)):
        starts, DT = torch.full_like(E, float("nan")), torch.full_like(D0, float("nan"))
        segment_carry((2, 2, N * H), E=E, LD=LD, D0=D0, STARTS=starts, DT=DT, first=first, REVERSE=reverse,
                      HAS_D0=with_d0, H=H, K=K, V=V, BK=64, BV=64, num_warps=4)
        want_starts, want_ends = torch.empty_like(E), torch.empty_like(D0)
        for n in range(N):
            D = D0[n].clone() if with_d0 else torch.zeros_like(D0[n])
            mine = list(range(first[n], first[n + 1]))
            for s in (mine[::-1] if reverse else mine):
                want_starts[s] = D
                D = LD[s].exp()[:, None, None] * D + E[s]
            want_ends[n] = D
        case = f"carry-{'reverse' if reverse else 'forward'}{'' if with_d0 else '-from-zero'}"
        compare(case, {"starts": want_starts.double(), "ends": want_ends.double()}, {"starts": starts, "ends": DT})


def test_fused_rla_kernels_match_naive_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=66, timeout=900)


def test_long_sequences_split_into_segments():
    """run_state_pass's segments: each sequence cut at every `per` chunks, in the kernels' offsets, and where each
    sequence's segments start (the carry between them is checked under the interpreter, `check_carry`)."""
    import torch

    from rla_ablate.ops.triton import rla as fused
    from rla_ablate.ops.triton.rla import Layout, Segments

    lengths = [9, 1, 20, 4]  # chunks of 4: 3, 1, 5, 1 -> segments of 2 chunks: 2, 1, 3, 1
    layout = Layout(1, sum(lengths), torch.tensor([0, 9, 10, 30, 34]), chunk=4, device="cpu")
    segs = Segments(layout, per=2, chunk=4, device="cpu")
    assert segs.count == 7
    assert segs.cu.tolist() == [0, 8, 9, 10, 18, 26, 30, 34]
    assert segs.coff.tolist() == [0, 2, 3, 4, 6, 8, 9]
    assert segs.first.tolist() == [0, 2, 3, 6, 7]
    # when it splits: few programs and a sequence over two segments long; never with an empty sequence
    rule = fused.SplitRule(programs=100, chunks=2)
    fused_rule, fused.SPLIT = fused.SPLIT, rule
    try:
        assert fused._segments(layout, 99, 4, "cpu") is not None
        assert fused._segments(layout, 100, 4, "cpu") is None
        assert fused._segments(Layout(1, 8, torch.tensor([0, 8]), chunk=4, device="cpu"), 1, 4, "cpu") is None
        assert fused._segments(Layout(1, 20, torch.tensor([0, 0, 20]), chunk=4, device="cpu"), 1, 4, "cpu") is None
    finally:
        fused.SPLIT = fused_rule
    assert fused.SPLIT == fused.SplitRule() and fused.SPLIT.chunks * 64 == 8192


def test_layout_lists_chunks():
    import torch

    from rla_ablate.ops.triton.rla import Layout

    lengths = [5, 0, 1, 9]
    layout = Layout(1, sum(lengths), torch.tensor([0, 5, 5, 6, 15]), chunk=4, device="cpu")
    assert (layout.N, layout.chunks, layout.tokens) == (4, 2 + 0 + 1 + 3, 15)
    assert layout.coff.tolist() == [0, 2, 2, 3, 6]
    assert layout.cidx.view(-1, 2).tolist() == [[0, 0], [0, 1], [2, 0], [3, 0], [3, 1], [3, 2]]
    batched = Layout(3, 7, None, chunk=4, device="cpu")
    assert batched.cu.tolist() == [0, 7, 14, 21] and batched.chunks == 6
    cached = Layout.batched(3, 7, 4, torch.device("cpu"))  # built once per shape, as every layer call asks again
    assert cached is Layout.batched(3, 7, 4, torch.device("cpu"))
    assert cached.cidx.tolist() == batched.cidx.tolist()
    assert (lambda empty: (empty.chunks, empty.tokens))(Layout(1, 0, torch.tensor([0, 0]), chunk=4, device="cpu")) == (0, 0)


def test_fused_kernels_take_only_what_ran_on_the_gpu():
    import torch

    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.rla import covers

    x = torch.zeros(1, 2, 1, 128, dtype=torch.bfloat16)
    assert covers(x, x, ResidualSpec()) and covers(x.half(), x, ResidualSpec(fit="none"))
    assert not covers(x.float(), x, ResidualSpec())  # fp32 tiles exceed shared memory
    assert not covers(x, torch.zeros(1, 2, 1, 256, dtype=torch.bfloat16), ResidualSpec())  # would loop over V
    assert not covers(x, x, ResidualSpec(rule="delta")) and not covers(x, x, ResidualSpec(fit="off"))


def test_calls_whose_chunks_exceed_a_grid_axis_take_the_composition():
    from rla_ablate.ops.triton.rla import MAX_CHUNKS, chunks_fit_grid

    assert chunks_fit_grid(32 * 2048, 32, 16) and chunks_fit_grid(64 * (MAX_CHUNKS - 1), 1, 16)
    assert not chunks_fit_grid(64 * MAX_CHUNKS, 1, 16)  # 4.2M tokens: one partial chunk too many
    assert not chunks_fit_grid(64 * 60000, 6000, 1)  # packed: every sequence may end in a partial chunk
    assert not chunks_fit_grid(4096 * 256, 4096, 16)  # 4,096 packed documents x 16 heads: one state pass too many


if __name__ == "__main__":
    check_all()


def test_a_split_rule_is_parsed_as_the_benchmarks_take_it():
    """`--rla-split PROGRAMS:CHUNKS` of benchmarks/kernels.py and train_gpu.py: one parser, what is allowed said."""
    from rla_ablate.ops.triton.rla import SplitRule

    assert SplitRule.parse("1024:16") == SplitRule(programs=1024, chunks=16)
    assert SplitRule.parse("0:1") == SplitRule(programs=0, chunks=1)
    for bad in ("1024", "1024:0", "-1:8", "a:8", "1:2:3"):
        with pytest.raises(ValueError, match=f"--rla-split takes PROGRAMS:CHUNKS.*got '{bad}'"):
            SplitRule.parse(bad)


def test_a_read_ahead_rule_picks_by_kind_programs_and_tiles(monkeypatch):
    """`AheadRule`: a pass with at most `most` programs of 64 x 64 state tiles reads ahead by its kind's setting, one
    with more programs or wider tiles (a split pass keeps its 64 x 128) not; the launchers give the kernel what it
    picks for the pass they launch (dS's pass is the one with two terms)."""
    import torch

    from rla_ablate.ops.triton import rla

    rule, cpu = rla.AheadRule(most=256), torch.device("cpu")
    assert [rule.pick(kind, 256, cpu) for kind in ("fwd", "rev", "rev2", "s")] == [1, 1, 2, 0]
    assert [rule.pick(kind, 257, cpu) for kind in ("fwd", "rev", "rev2", "s")] == [0, 0, 0, 0]
    assert [rule.pick(kind, 256, cpu, 64 * 128) for kind in ("fwd", "rev", "rev2", "s")] == [0, 0, 0, 0]
    assert rla.AheadRule().pick("fwd", 1, cpu) == 0  # off CUDA the default bound is 0 programs: none reads ahead
    seen = []

    class Launch:  # stands in for a jitted kernel: `kernel[grid](*args, **constants)`
        def __getitem__(self, grid):
            return lambda *args, AHEAD, **kw: seen.append((grid, AHEAD))

    monkeypatch.setattr(rla, "_state_pass", Launch())
    monkeypatch.setattr(rla, "_s_pass_residual", Launch())
    monkeypatch.setattr(rla, "READ_AHEAD", rla.AheadRule(most=8))
    g = torch.zeros(1)
    common = dict(ka=g, ua=g, sa=g, kb=g, ub=g, g=g, D0=g, hD=g, DT=g, cu=g, coff=g, scale_a=1.0, H=1, K=64, V=64,
                  BT=64, BK=64, BV=64, CA=0, CB=0, HAS_SA=True, HAS_D0=False)
    rla.state_pass((2, 2, 2), sign_b=0.0, REVERSE=False, HAS_B=False, **common)   # R's pass, 8 programs
    rla.state_pass((2, 2, 2), sign_b=0.0, REVERSE=True, HAS_B=False, **common)    # dR's
    rla.state_pass((2, 2, 2), sign_b=-1.0, REVERSE=True, HAS_B=True, **common)    # dS's
    rla.state_pass((2, 2, 3), sign_b=-1.0, REVERSE=True, HAS_B=True, **common)    # dS's with 12 programs
    rla.state_pass((2, 2, 2), sign_b=0.0, REVERSE=True, HAS_B=False, AHEAD=0, **common)  # a caller's own setting
    rla.state_pass((2, 1, 2), sign_b=0.0, REVERSE=False, HAS_B=False, **{**common, "BV": 128})  # 64 x 128 tiles
    rla.s_pass_residual((2, 4), k=g, v=g, g=g, beta=g, D0=g, hS=g, ST=g, X=g, W=g, cu=g, coff=g, c_clip=1.0, H=1,
                        K=64, V=64, BT=64, BK=64, BV=64, HAS_D0=False, TARGET=0)
    assert [ahead for _, ahead in seen] == [1, 1, 2, 0, 0, 0, 0]


def test_a_launch_change_is_parsed_as_the_benchmarks_take_it():
    """`--rla-launch KERNEL:KEY=VALUE,...` of benchmarks/kernels.py and train_gpu.py: the kernel's entry with those
    options changed, the table left as it was; what is allowed said."""
    from rla_ablate.ops.triton.common import parse_launch
    from rla_ablate.ops.triton.rla import LAUNCH

    before = {k: dict(v) for k, v in LAUNCH.items()}
    name, options = parse_launch("state_pass:BK=128,num_warps=8", LAUNCH)
    assert (name, options) == ("state_pass", dict(LAUNCH["state_pass"], BK=128, num_warps=8))
    assert LAUNCH == before
    # the settings the benchmarks run them with: LAUNCH with the entry, and a named state pass not narrowed
    from rla_ablate.ops.triton.rla import launch_settings

    settings = launch_settings({name: options})
    assert settings["LAUNCH"] == {**before, name: options} and settings["NARROW_BELOW"] == 0
    assert launch_settings({"bwd_dv": dict(LAUNCH["bwd_dv"], num_warps=8)}).keys() == {"LAUNCH"}
    assert LAUNCH == before
    # several texts, as the scripts take them: each read with the earlier ones applied
    from rla_ablate.ops.triton.rla import parse_launches

    assert parse_launches(["state_pass:BK=128", "state_pass:num_warps=8"]) == {name: options}
    assert LAUNCH == before
    for bad, said in (("nope:BK=64", "no kernel 'nope'; kernels: state_pass, "), ("state_pass", "takes KERNEL:KEY"),
                      ("state_pass:", "takes KERNEL:KEY"),
                      ("state_pass:BQ=64", "no option 'BQ'; options of state_pass: BK, BV, num_warps"),
                      # the dq/dk kernel holds the whole V (a narrower tile would drop columns); the others the K
                      ("bwd_dqk:BV=64", "no option 'BV'; options of bwd_dqk: BK, num_warps"),
                      ("fwd_output:BK=64", "no option 'BK'; options of fwd_output: BV, num_warps"),
                      ("state_pass:BK=96", "power of two of at least 64; got 96"),
                      ("state_pass:BV=32", "power of two of at least 64; got 32"),
                      ("state_pass:num_warps=0", "positive integer; got '0'"),
                      ("state_pass:num_warps=four", "positive integer; got 'four'")):
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_launch(bad, LAUNCH)
