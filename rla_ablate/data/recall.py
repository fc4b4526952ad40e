"""Synthetic recall tasks, generated on the fly from (key, example index): MQAR and needle-in-a-haystack.

Every example is a pure function of a 64-bit key and its index (see `rng`), so a stream resumes at any index
and an eval set is the same list on every machine. Labels hold -100 except at the answer positions, where
`labels[t]` is the token the model must predict after reading `input_ids[:t + 1]`; recall accuracy is
`(logits.argmax(-1) == labels)[labels != -100].float().mean()`.
"""

from __future__ import annotations

import numpy as np

from rla_ablate.data.config import MQARData, NIAHData
from rla_ablate.data.rng import derive_key, random_below, random_bits, random_uniform
from rla_ablate.errors import UserError

IGNORE = -100
# Counters are index * _STRIDE + slot, so every (example, slot) pair draws its own bits.
_STRIDE = 1 << 24


def _distinct(key: int, idx: np.ndarray, k: int, low: int, high: int) -> np.ndarray:
    """[n, k] distinct integers from [low, high) per example, in random order (Floyd's algorithm, then a shuffle)."""
    m = high - low
    n = idx.size
    chosen = np.empty((n, k), dtype=np.int64)
    base = idx.astype(np.uint64) * np.uint64(_STRIDE)
    tops = m - k + np.arange(k, dtype=np.int64)
    draws = random_below(key, (base[:, None] + np.arange(k, dtype=np.uint64)).ravel(),
                         np.tile(tops + 1, n)).reshape(n, k)
    for j in range(k):
        # Floyd: draw t in [0, m - k + j]; if already chosen, take m - k + j itself. The set is uniform.
        t = draws[:, j]
        taken = (chosen[:, :j] == t[:, None]).any(axis=1)
        chosen[:, j] = np.where(taken, tops[j], t)
    order = np.argsort(random_bits(key, base[:, None] + np.uint64(k) + np.arange(k, dtype=np.uint64)),
                       axis=1, kind="stable")
    return low + np.take_along_axis(chosen, order, axis=1)


def mqar_examples(cfg: MQARData, seq_len: int, key: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MQAR as in Zoology: `k1 v1 ... kK vK` then the query region, where key j sits at context + 2·gap_j and
    its label is v_j; gaps are drawn without replacement with P(gap = g) ∝ (g + 1)^(power_a - 1)."""
    n, kv, vocab = idx.size, cfg.num_kv_pairs, cfg.vocab_size
    context = 2 * kv
    space = (seq_len - context) // 2
    if space < kv:
        raise UserError(f"seq_len={seq_len} leaves room for {space} queries, fewer than num_kv_pairs={kv}",
                        key="num_kv_pairs")
    half = vocab // 2
    keys = _distinct(derive_key(key, "keys"), idx, kv, 1, half)
    values = _distinct(derive_key(key, "values"), idx, kv, half, vocab)

    # Efraimidis-Spirakis: the k largest log(u) / w are a weighted draw without replacement, in draw order.
    weights = (np.arange(1, space + 1, dtype=np.float64)) ** (cfg.power_a - 1.0)
    counters = idx.astype(np.uint64)[:, None] * np.uint64(_STRIDE) + np.arange(space, dtype=np.uint64)
    scores = np.log(random_uniform(derive_key(key, "gaps"), counters.ravel())).reshape(n, space) / weights
    gaps = np.argsort(-scores, axis=1, kind="stable")[:, :kv]

    inputs = np.zeros((n, seq_len), dtype=np.int64)
    if cfg.random_non_queries:
        noise_ctr = idx.astype(np.uint64)[:, None] * np.uint64(_STRIDE) + np.arange(seq_len, dtype=np.uint64)
        inputs[:] = random_below(derive_key(key, "noise"), noise_ctr.ravel(), vocab).reshape(n, seq_len)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    labels = np.full((n, seq_len), IGNORE, dtype=np.int64)
    query_pos = context + 2 * gaps
    np.put_along_axis(inputs, query_pos, keys, axis=1)
    np.put_along_axis(labels, query_pos, values, axis=1)
    return inputs, labels


_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


class NeedleTask:
    """Needle in a haystack over a token source: filler, the needle 'The secret code for <name> is <value>.' at a
    depth, more filler, the cue 'The secret code for <name> is ', the answer. The answer is tokenized on its own,
    so its positions are exact under any tokenizer."""

    def __init__(self, cfg: NIAHData, source, context_length: int):
        self.cfg, self.source, self.tok = cfg, source, source.tokenizer
        self.context_length = context_length
        # The longest needle and cue the templates produce, to check the length up front.
        longest = self._parts("zzzzzz", "9" * cfg.value_digits)
        fixed = sum(p.size for p in longest)
        if fixed + 16 > context_length + 1:
            raise UserError(f"context_length={context_length} is too short for the needle and cue "
                            f"({fixed} tokens); use at least {fixed + 16}", key="context_length")
        if len(source) < context_length + 1:
            raise UserError(f"the haystack has {len(source)} tokens, fewer than context_length={context_length}",
                            key="haystack")

    def _parts(self, name: str, value: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        enc = self.tok.encode
        needle = enc(f"\nThe secret code for {name} is {value}.\n")
        # The cue repeats the needle's wording, so even a small model trained on text can complete it.
        cue = enc(f"\nThe secret code for {name} is ")
        return needle, cue, enc(value)

    def examples(self, key: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cfg, T = self.cfg, self.context_length
        n = idx.size
        base = idx.astype(np.uint64) * np.uint64(_STRIDE)
        letters = random_below(derive_key(key, "name"), (base[:, None] + np.arange(6, dtype=np.uint64)).ravel(), 26)
        letters = _LETTERS[letters.reshape(n, 6)]
        first = 1 + random_below(derive_key(key, "value0"), base, 9)
        rest = random_below(derive_key(key, "value"),
                            (base[:, None] + np.arange(18, dtype=np.uint64)).ravel(), 10).reshape(n, 18)
        inputs = np.empty((n, T), dtype=np.int64)
        labels = np.full((n, T), IGNORE, dtype=np.int64)
        for row in range(n):
            name = letters[row].tobytes().decode("ascii")
            value = str(first[row]) + "".join(str(d) for d in rest[row, : cfg.value_digits - 1])
            needle, cue, answer = self._parts(name, value)
            fill = T + 1 - needle.size - cue.size - answer.size
            start = int(random_below(derive_key(key, "offset"), idx[row:row + 1], len(self.source) - fill)[0])
            filler = self.source.window(start, start + fill)
            depth = cfg.depths[int(idx[row]) % len(cfg.depths)]
            cut = int(round(depth * fill))
            seq = np.concatenate([filler[:cut], needle, filler[cut:], cue, answer])
            inputs[row] = seq[:-1]
            a = seq.size - answer.size
            labels[row, a - 1:] = seq[a:]
        return inputs, labels
