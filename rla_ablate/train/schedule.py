"""Learning rate as a function of tokens seen: linear warmup, then cosine decay to a floor (paper App. C).

The schedule is a pure function of the token count, so it needs no state of its own in a checkpoint and
gives the same value whatever the batch size or the number of workers.
"""

from __future__ import annotations

import math


def lr_at(tokens: int, *, lr: float, min_lr: float, warmup_tokens: int, total_tokens: int) -> float:
    """The learning rate after `tokens` training tokens.

    The loop asks for the value at the end of each step (tokens seen + batch tokens), so the first update
    already moves the weights and the last one uses exactly `min_lr`.
    """
    if tokens < warmup_tokens:
        return lr * tokens / warmup_tokens
    decay_tokens = max(total_tokens - warmup_tokens, 1)
    progress = min(max(tokens - warmup_tokens, 0) / decay_tokens, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
