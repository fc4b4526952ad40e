"""The fused RLA kernels (rla_ablate/ops/triton/rla.py) on CPU, through Triton's interpreter (TRITON_INTERPRET=1).

The interpreter must be chosen before the kernels are defined, so the checks run in a fresh process (this file as
a script). fp32 kernels against the float64 naive contract on the same inputs: outputs, final states and all eight
gradients (dg comes from the reverse-cumsum identity, the least obvious part). A chunk of 16 tokens makes T=37 span
three chunks, the last one partial; clip=0.7 puts many residuals outside the clip. Then packed sequences of uneven
lengths (one of a single token, one empty), K and V that are not powers of two (masked tiles) and wider than
one tile (K=80, V=72: partial sums over tiles), gates of -1e5 and -300, and a call without initial states. Measured: every error <= 1.1e-6 (relative RMS), tolerance 1e-5.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("triton")

RATIO, ATOL = 1e-5, 1e-6


def check_all() -> None:
    import torch
    from interpreter_checks import Comparer, check_packed, make, run

    from rla_ablate.ops.naive import naive_residual_attention
    from rla_ablate.ops.spec import ResidualSpec
    from rla_ablate.ops.triton.rla import rla_triton

    compare = Comparer(RATIO, ATOL)

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


def test_fused_rla_kernels_match_naive_under_the_interpreter():
    from interpreter_checks import run_interpreted

    run_interpreted(__file__, checks=18, timeout=900)


def test_layout_lists_chunks_and_sums_each_chunk_from_the_end():
    import torch

    from rla_ablate.ops.triton.rla import Layout

    lengths = [5, 0, 1, 9]
    layout = Layout(1, sum(lengths), torch.tensor([0, 5, 5, 6, 15]), chunk=4, device="cpu")
    assert (layout.N, layout.chunks) == (4, 2 + 0 + 1 + 3)
    assert layout.coff.tolist() == [0, 2, 2, 3, 6]
    assert layout.cidx.view(-1, 2).tolist() == [[0, 0], [0, 1], [2, 0], [3, 0], [3, 1], [3, 2]]
    assert layout.chunk_of_token.tolist() == [0] * 4 + [1] + [2] + [3] * 4 + [4] * 4 + [5]
    x = torch.randn(sum(lengths), 3)
    want, start = [], 0
    for size in (4, 1, 1, 4, 4, 1):  # chunks of 4 tokens restart with each sequence; the last of each is partial
        part = x[start:start + size]
        want += [part[t:].sum(0) for t in range(size)]
        start += size
    torch.testing.assert_close(layout.chunk_reverse_cumsum(x), torch.stack(want), rtol=1e-6, atol=1e-6)
    batched = Layout(3, 7, None, chunk=4, device="cpu")
    assert batched.cu.tolist() == [0, 7, 14, 21] and batched.chunks == 6
    cached = Layout.batched(3, 7, 4, torch.device("cpu"))  # built once per shape, as every layer call asks again
    assert cached is Layout.batched(3, 7, 4, torch.device("cpu"))
    assert cached.cidx.tolist() == batched.cidx.tolist()
    assert cached.chunk_of_token.tolist() == [0] * 4 + [1] * 3 + [2] * 4 + [3] * 3 + [4] * 4 + [5] * 3
    assert Layout(1, 0, torch.tensor([0, 0]), chunk=4, device="cpu").chunk_of_token.numel() == 0


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
