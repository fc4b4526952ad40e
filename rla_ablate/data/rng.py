"""Counter-based random numbers and permutations that are identical on every machine and library version.

NumPy's `Generator` and Python's `random` do not promise the same stream across versions, and the CI asserts a
golden loss curve exactly, so data order and synthetic tasks use this small, fully specified scheme instead:
a 64-bit key per purpose (`derive_key`), SplitMix64 finalisation of (key, counter) for random bits, and a
Feistel network with cycle walking for permutations of [0, n) that never materialise the whole index.
"""

from __future__ import annotations

import hashlib

import numpy as np

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)
_FEISTEL_ROUNDS = 6


def derive_key(*parts: object) -> int:
    """A 64-bit key from any parts (purpose, seed, epoch, ...): SHA-256 of their `str` joined by '/'."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little")


def _mix(x: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser; uint64 array arithmetic wraps modulo 2**64 by definition.
    x = (x ^ (x >> _U64(30))) * _M1
    x = (x ^ (x >> _U64(27))) * _M2
    return x ^ (x >> _U64(31))


def random_bits(key: int, counters) -> np.ndarray:
    """64 random bits (uint64) for each counter, a pure function of (key, counter)."""
    c = np.atleast_1d(np.asarray(counters, dtype=np.uint64))
    return _mix(c * _GOLDEN + _mix(np.array([key], dtype=np.uint64)))


def random_below(key: int, counters, high) -> np.ndarray:
    """Integers in [0, high) (int64); `high` may be an array broadcasting with `counters`.

    Uses the top 32 bits times `high`, shifted (Lemire's reduction without rejection): the bias is below
    high / 2**32, irrelevant for token ids and positions."""
    bits = random_bits(key, counters) >> _U64(32)
    return ((bits * np.asarray(high, dtype=np.uint64)) >> _U64(32)).astype(np.int64)


def random_uniform(key: int, counters) -> np.ndarray:
    """Floats in (0, 1) (float64), 53 random bits each, never exactly 0 or 1."""
    bits = random_bits(key, counters) >> _U64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0**-53


class Permutation:
    """A pseudo-random bijection of [0, n) indexed lazily: `perm[i]` for arrays of i, O(1) memory.

    A balanced Feistel network permutes [0, 4**h) with 4**h >= n; values that land outside [0, n) are
    permuted again (cycle walking) until they fall inside, which keeps it a bijection of [0, n).
    """

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("a permutation needs n >= 1")
        self.n = n
        half = 1
        while 4**half < n:
            half += 1
        self._half = _U64(half)
        self._mask = _U64((1 << half) - 1)
        self._round_keys = [derive_key("feistel", key, r) for r in range(_FEISTEL_ROUNDS)]

    def _once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (random_bits(rk, right) & self._mask)
        return (left << self._half) | right

    def __getitem__(self, index) -> np.ndarray:
        i = np.atleast_1d(np.asarray(index, dtype=np.int64))
        if i.size and (i.min() < 0 or i.max() >= self.n):
            raise IndexError(f"permutation index out of range [0, {self.n})")
        x = self._once(i.astype(np.uint64))
        outside = x >= _U64(self.n)
        while outside.any():
            x[outside] = self._once(x[outside])
            outside = x >= _U64(self.n)
        return x.astype(np.int64)
