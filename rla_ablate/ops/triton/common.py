"""The pieces shared by our Triton kernels (`rla`, `rdn`, `glue`): the residual's targets, the chunk and
state-pass helpers, the packed-sequence layout, dg's assembly, launch options and the named constexpr codes.

Kernels compare their constexpr codes against the tl.constexpr constants here (Triton reads only constexpr
globals inside a kernel); launch sites pass the same integers (`.value`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# the residual's target T: TARGET (a kernel's constexpr) selects clip, tanh or identity
TARGET_CLIP = tl.constexpr(0)
TARGET_TANH = tl.constexpr(1)
TARGET_IDENTITY = tl.constexpr(2)
TARGET_CODES = {"clip": TARGET_CLIP.value, "tanh": TARGET_TANH.value, "identity": TARGET_IDENTITY.value}
# the per-token weight of a state pass's term (its CA, CB): exp(b_L - b) (a write, to the chunk end), exp(b), exp(b')
COEF_TO_END = tl.constexpr(0)
COEF_B = tl.constexpr(1)
COEF_B_PRIME = tl.constexpr(2)

CHUNK = 64
MAX_HEAD_DIM = 128
# Every tile of a dot is at least 64 wide, padded by masks: on Hopper, Triton 3.6/3.7 miscompiles kernels holding
# several dots with 16- or 32-wide operands (illegal shared-memory reads, triton-lang/triton#11366); BV=32 faults on
# the H200.
MIN_TILE = 64
G_FLOOR = tl.constexpr(-60.0)


@triton.jit
def _target(x, c, TARGET: tl.constexpr):
    if TARGET == TARGET_CLIP:
        y = tl.minimum(tl.maximum(x, -c), c)
    elif TARGET == TARGET_TANH:
        # c * tanh(x / c) through exp, saturating cleanly at +-c for large |x|
        y = c * (1.0 - 2.0 / (tl.exp(2.0 * x / c) + 1.0))
    else:
        y = x
    return y


@triton.jit
def _target_slope(x, c, TARGET: tl.constexpr):
    if TARGET == TARGET_CLIP:
        # torch.clamp passes the gradient on the closed interval [-c, c]
        d = tl.where((x >= -c) & (x <= c), 1.0, 0.0)
    elif TARGET == TARGET_TANH:
        th = 1.0 - 2.0 / (tl.exp(2.0 * x / c) + 1.0)
        d = 1.0 - th * th
    else:
        d = tl.full(x.shape, 1.0, tl.float32)
    return d


@triton.jit
def _keep_for_slope(X, o, m, x, c, TARGET: tl.constexpr):
    """Store at X what a backward needs of the residual's input x (= v - p) for the target's slope T'(x): the clip's
    slope itself (0 or 1, one byte), tanh's x (fp32), nothing for the identity. bf16 cannot hold x: T'(x) flips for
    every x that rounds across +-c."""
    if TARGET == TARGET_CLIP:
        tl.store(X + o, _target_slope(x, c, TARGET).to(X.dtype.element_ty), mask=m)
    elif TARGET != TARGET_IDENTITY:
        tl.store(X + o, x, mask=m)


@triton.jit
def _times_kept_slope(d, X, o, m, c, TARGET: tl.constexpr):
    """d T'(x), with T'(x) from what `_keep_for_slope` kept at X (fp32 d)."""
    if TARGET == TARGET_CLIP:
        d = d * tl.load(X + o, mask=m, other=0).to(tl.float32)
    elif TARGET != TARGET_IDENTITY:
        d = d * _target_slope(tl.load(X + o, mask=m, other=0.0), c, TARGET)
    return d


@triton.jit
def _decay(rows, cols, keep):
    """exp(rows_t - cols_s) where keep[t, s], else 0 (masked before exp: never inf)."""
    return tl.exp(tl.where(keep, rows[:, None] - cols[None, :], float("-inf")))


@triton.jit
def _chunk_gates(g, tok, mt):
    """b = chunk-local cumsum of g, b' = b - g, b_L = the chunk's total (rows past the end carry g = 0).

    g is floored at G_FLOOR: alpha = exp(-60) < 1e-26 already erases the state in fp32, and the floor keeps b small
    enough that exp(b_t - b_s) stays exact to fp32 rounding when one gate is huge (g = -1e5 would cost 1% there).
    """
    b_g = tl.maximum(tl.load(g + tok, mask=mt, other=0.0).to(tl.float32), G_FLOOR)
    b = tl.cumsum(b_g, axis=0)
    return b, b - b_g, tl.sum(b_g, axis=0)


@triton.jit
def _chunk_rows(cu, cidx, i_c, h, H: tl.constexpr, BT: tl.constexpr):
    """Chunk i_c of the chunk list: its sequence n, the sequence end, token indices t, their mask, and row offsets."""
    n, c = tl.load(cidx + 2 * i_c).to(tl.int64), tl.load(cidx + 2 * i_c + 1).to(tl.int64)
    bos, eos = tl.load(cu + n).to(tl.int64), tl.load(cu + n + 1).to(tl.int64)
    t = bos + c * BT + tl.arange(0, BT)
    mt = t < eos
    return n, eos, t, mt, t * H + h


@triton.jit
def _chunk_tile(cu, cidx, i_c, h, i_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr):
    """_chunk_rows plus the column ranges of a full-K x V-tile program and the masks of its [BT, K] and [BT, BV] tiles."""
    n, eos, t, mt, tok = _chunk_rows(cu, cidx, i_c, h, H, BT)
    rk, rv = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    return n, eos, t, mt, tok, rk, rv, mk, mv, mt[:, None] & mk[None, :], mt[:, None] & mv[None, :]


@triton.jit
def _pass_program(cu, coff, D0, i_k, i_v, i_nh, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, HAS_D0: tl.constexpr):
    """A state pass's program (one sequence and head, one BV x BK state tile): the head, the sequence's token range
    and first chunk, the tile's columns, masks and offsets, and its starting value (D0's tile or zeros, fp32)."""
    n, h = i_nh // H, i_nh % H
    bos, eos = tl.load(cu + n).to(tl.int64), tl.load(cu + n + 1).to(tl.int64)
    c0 = tl.load(coff + n).to(tl.int64)
    rk, rv = i_k * BK + tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    m_state = mv[:, None] & mk[None, :]
    o_state = rv[:, None] * K + rk[None, :]
    o_seq = (n * H + h).to(tl.int64) * V * K
    D = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_D0:
        D += tl.load(D0 + o_seq + o_state, mask=m_state, other=0.0).to(tl.float32)
    return h, bos, eos, c0, rk, rv, mk, mv, m_state, o_state, o_seq, D


@triton.jit
def _pass_tokens(bos, eos, c, h, mk, mv, H: tl.constexpr, BT: tl.constexpr):
    """Chunk c of a state pass's sequence: its token mask, row offsets and the masks of its [BT, K] and [BT, V]
    tiles (mk, mv: the tile's column masks)."""
    t = bos + c * BT + tl.arange(0, BT)
    mt = t < eos
    return mt, t * H + h, mt[:, None] & mk[None, :], mt[:, None] & mv[None, :]


@triton.jit
def _pass_chunk(g, bos, eos, c, h, mk, mv, H: tl.constexpr, BT: tl.constexpr, MADE: tl.constexpr):
    """Chunk c of a state pass's sequence: token indices, their mask, row offsets, tile masks and the gates b, b',
    b_L. MADE: g holds the gates made once (`made_gates`: b, the chunk-local cumsum), so b is loaded, b' is the b of
    the token before in the chunk (0 for its first) and b_L the b of its last token: no scan and no sum on the
    pass's sequential path, where they cost a barrier each per chunk. Else g is the raw g and `_chunk_gates` makes
    them. Either way rows past the end carry b = b' = b_L."""
    r = tl.arange(0, BT)
    mt, tok, m_tk, m_tv = _pass_tokens(bos, eos, c, h, mk, mv, H, BT)
    if MADE:
        end = tl.minimum(bos + c * BT + BT, eos)  # a chunk past the sequence's end (a read ahead of an empty one)
        b_L = tl.load(g + (end - 1) * H + h, mask=end > bos + c * BT, other=0.0)  # reads nothing
        b = tl.where(mt, tl.load(g + tok, mask=mt, other=0.0), b_L)
        bp = tl.where(mt, tl.load(g + tok - H, mask=mt & (r > 0), other=0.0), b_L)
    else:
        b, bp, b_L = _chunk_gates(g, tok, mt)
    return mt, tok, m_tk, m_tv, b, bp, b_L


@triton.jit
def _made_gates(g, BG, cu, cidx, H: tl.constexpr, BT: tl.constexpr):
    """b of one chunk and head (grid chunks x heads): `_chunk_gates`' chunk-local cumsum of the floored g."""
    i_c, h = tl.program_id(0), tl.program_id(1)
    _, _, _, mt, tok = _chunk_rows(cu, cidx, i_c, h, H, BT)
    b, _, _ = _chunk_gates(g, tok, mt)
    tl.store(BG + tok, b, mask=mt)


class Layout:
    """Packed-sequence bookkeeping shared by the kernels: cu_seqlens, chunk offsets and the chunk list."""

    def __init__(self, B: int, T: int, cu_seqlens: torch.Tensor | None, chunk: int, device):
        if cu_seqlens is None:
            lengths = [T] * B
        else:
            lengths = cu_seqlens.diff().tolist()
        counts = [-(-n // chunk) for n in lengths]
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        self.N, self.chunks, self.lengths = len(lengths), starts[-1], lengths
        ends = [0]
        for n in lengths:
            ends.append(ends[-1] + n)
        self.cu = torch.tensor(ends, dtype=torch.int32, device=device)
        self.coff = torch.tensor(starts, dtype=torch.int32, device=device)
        pairs = [(n, c) for n, count in enumerate(counts) for c in range(count)]
        self.cidx = torch.tensor(pairs or [(0, 0)], dtype=torch.int32, device=device).flatten()
        self.tokens = ends[-1]

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def batched(B: int, T: int, chunk: int, device: torch.device) -> Layout:
        """The layout of B sequences of T tokens, built once per shape: building one copies host lists to the device,
        which every layer of every step would otherwise repeat (its tensors are only read)."""
        return Layout(B, T, None, chunk, device)


@triton.jit
def _gate_gradient(RP, PP, MP, EXTRA, Z_P, DG, cu, cidx, NTH, NCH, NK: tl.constexpr, NZ: tl.constexpr,
                   BZ: tl.constexpr, H: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr, HAS_PP: tl.constexpr,
                   HAS_EXTRA: tl.constexpr):
    """dg of one chunk, every head (grid chunks) from the partials of `gate_gradient`. The chunk's rows are taken
    last token first, so that a prefix sum down the tile is each token's sum to the chunk's end; rows of H heads
    side by side, as the partials lie."""
    i_c = tl.program_id(0)
    _, eos, t, _, _ = _chunk_rows(cu, cidx, i_c, 0, H, BT)
    t = t + (BT - 1 - 2 * tl.arange(0, BT))  # the same rows, last token first
    rh = tl.arange(0, BH)
    m = (t < eos)[:, None] & (rh < H)[None, :]
    o = t[:, None] * H + rh[None, :]
    reads = tl.zeros([BT, BH], dtype=tl.float32)
    terms = tl.zeros([BT, BH], dtype=tl.float32)
    for i in tl.static_range(NK):
        reads += tl.load(RP + i * NTH + o, mask=m, other=0.0)
        if HAS_PP:
            terms += tl.load(PP + i * NTH + o, mask=m, other=0.0)
        terms -= tl.load(MP + i * NTH + o, mask=m, other=0.0)
    terms += reads
    if HAS_EXTRA:
        terms += tl.load(EXTRA + o, mask=m, other=0.0).to(tl.float32)
    z = tl.zeros([BH], dtype=tl.float32)
    rz = tl.arange(0, BZ)
    for i in tl.static_range(0, NZ, BZ):  # BZ rows at a time (a state pass may write one per row of its tiles)
        m_z = (i + rz < NZ)[:, None] & (rh < H)[None, :]
        z += tl.sum(tl.load(Z_P + (i + rz).to(tl.int64)[:, None] * NCH + i_c * H + rh[None, :], mask=m_z, other=0.0),
                    axis=0)
    tail = tl.cumsum(terms, axis=0)  # sum_{j >= t} within the chunk
    tl.store(DG + o, tail - reads + z[None, :], mask=m)


def gate_gradient(layout: Layout, reads: torch.Tensor, minus: torch.Tensor, Z_P: torch.Tensor, H: int, chunk: int,
                  plus: torch.Tensor | None = None, extra: torch.Tensor | None = None) -> torch.Tensor:
    """dg [tokens, H] fp32 from the kernels' per-K-tile partials [NK, tokens * H] of the per-token terms of d/db,
    reads (those that start at b', E) plus `plus` minus `minus` (the writes) plus `extra` [tokens * H] (a term
    summed already), and their partials Z_P [rows, chunks * H] of each chunk's end term Z_c = <dS_end, S_end>
    (+ R's):

        dg_t = sum_{j >= t, same chunk} terms_j - E_t + Z_{chunk of t}

    (docs/MATH.md "dg without the states"), one program a chunk. Summed over the whole sequence instead,
    the terms' bf16 rounding accumulates and dg's error grows with the length (fp16 in the interpreter: 7e-4 at
    T=128, 6.5e-3 at 16K); the chunk's end term holds what the later chunks add, from the states, exactly."""
    NTH = reads.shape[1]
    dg = torch.empty(NTH, dtype=torch.float32, device=reads.device)
    C = max(layout.chunks, 1)
    _gate_gradient[(C,)](reads, plus if plus is not None else reads, minus, extra if extra is not None else reads,
                         Z_P, dg, layout.cu, layout.cidx, NTH, Z_P.shape[1], NK=reads.shape[0], NZ=Z_P.shape[0],
                         BZ=min(64, triton.next_power_of_2(Z_P.shape[0])),
                         H=H, BH=triton.next_power_of_2(H), BT=chunk, HAS_PP=plus is not None,
                         HAS_EXTRA=extra is not None)
    return dg.view(NTH // H, H)


def launch_options(name: str, V: int, table: dict) -> dict:
    """The launch options of one kernel in `table`: its V tile (at most V rounded up to a power of two, at least
    MIN_TILE; the whole V where the table names none), warps."""
    opts = dict(table[name])
    whole = triton.next_power_of_2(V)
    opts["BV"] = max(MIN_TILE, min(opts.get("BV", whole), whole))
    return opts


# the tile widths each kernel's launch options name (RLA's and RDN's LAUNCH tables); the others': BV alone. The dq/dk
# kernels hold the whole V in one tile, the parallel kernels the whole K.
TILE_KEYS = {"state_pass": ("BK", "BV"), "state_pass_2": ("BK", "BV"), "bwd_dqk": ("BK",), "dqk": ("BK",),
             "dqk_both": ("BK",), "wy_bwd": ("BK", "BV")}


def parse_launch(text: str, table: dict) -> tuple[str, dict]:
    """'KERNEL:KEY=VALUE[,KEY=VALUE...]', as the benchmarks' --rla-launch takes it: the kernel's entry of `table`
    (a LAUNCH table) with those options changed. Keys: the kernel's tile widths (`TILE_KEYS`), num_warps,
    num_stages; tile widths are powers of two of at least MIN_TILE. ValueError saying what is allowed."""
    name, _, settings = text.partition(":")
    if name not in table:
        raise ValueError(f"--rla-launch: no kernel {name!r}; kernels: {', '.join(table)}")
    options = dict(table[name])
    if not settings:
        raise ValueError(f"--rla-launch takes KERNEL:KEY=VALUE[,KEY=VALUE...]; got {text!r}")
    keys = (*TILE_KEYS.get(name, ("BV",)), "num_warps", "num_stages")
    for item in settings.split(","):
        key, _, value = item.partition("=")
        if key not in keys:
            raise ValueError(f"--rla-launch {name}: no option {key!r}; options of {name}: {', '.join(keys)}")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--rla-launch {name}: {key} takes a positive integer; got {value!r}")
        n = int(value)
        if key in ("BK", "BV") and (n < MIN_TILE or n & (n - 1)):
            raise ValueError(f"--rla-launch {name}: {key} takes a power of two of at least {MIN_TILE}; got {n}")
        options[key] = n
    return name, options


def made_gates(layout: Layout, g: torch.Tensor, H: int, chunk: int) -> torch.Tensor:
    """b for every token ([tokens, H] fp32, from g of the same shape): the gates a state pass reads
    (`_pass_chunk`, MADE) instead of making them in its sequential loop."""
    BG = torch.empty_like(g)
    _made_gates[(max(layout.chunks, 1), H)](g, BG, layout.cu, layout.cidx, H=H, BT=chunk, num_warps=1)
    return BG
