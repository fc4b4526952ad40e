"""Dotted-key overrides: the one engine that sets `train.lr`-style keys in a config tree.

Used by the sweep expansion (grid, zip and search points, `rla_ablate.sweep.expand`) and by `--set` and the
training profiles (`rla_ablate.train.overrides`). Dots separate levels; on a list, an integer indexes an entry and
the list's length adds one (`eval.1.name=mqar` on a one-entry list). Missing sections are created. `flat_dotted`
reads a tree back as such keys (MLflow params, what differs between two job configs).
"""

from __future__ import annotations

from typing import Any


class KeyPathError(ValueError):
    """A dotted key that does not fit the tree: a value where a section is needed, or a list index out of range."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key
        """The key up to the part that does not fit."""


def flat_dotted(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"model": {"hidden": 64}, "eval": [{"name": "val"}]} -> {"model.hidden": 64, "eval.0.name": "val"}: dicts and
    lists of sections by level, any other value (a list of numbers included) as one leaf."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flat_dotted(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)) and tree and any(isinstance(x, (dict, list)) for x in tree):
        for i, value in enumerate(tree):
            out.update(flat_dotted(value, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """Set `key` (dots between levels, integers index lists) in nested dicts and lists, creating dict levels."""
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) > len(node):
                raise KeyPathError(f"'{parts[depth - 1]}' is a list of {len(node)}; use an index 0..{len(node) - 1}, "
                                   f"or {len(node)} to add an entry", where)
            index = int(part)
            if index == len(node):
                node.append({})
            if last:
                node[index] = value
            else:
                node = node[index]
            continue
        if not isinstance(node, dict):
            raise KeyPathError(f"'{parts[depth - 1]}' is a value, not a section", where)
        if last:
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
