"""The residual attention combinations the ops tests run: every rule x fit x target x output_gates.

fit="off" has no residual to shape, so it appears once (clip target, output gates on). A plain module (like
dashboard_synthetic.py) so that test files and the interpreter checks run as scripts can import it.
"""

from __future__ import annotations

import itertools

COMBOS = [
    (rule, fit, target, og)
    for rule, fit, target, og in itertools.product(
        ["additive", "delta"], ["residual", "none", "off"], ["clip", "tanh", "identity"], [True, False])
    if fit != "off" or (target == "clip" and og)
]


def combo_id(c):
    rule, fit, target, og = c
    return f"{rule}-{fit}-{target}-{'gates' if og else 'nogates'}"
