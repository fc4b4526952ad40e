"""`--set key=value` overrides: dotted keys into a JobConfig dict, values parsed as YAML scalars.

    train.tokens=200000    model.fit=none    eval.0.tokens=8192    data.glob='**/*.md'
    eval.1.name=mqar  eval.1.data.kind=mqar        (index = length of the list: a new entry)

Unknown keys are reported by the JobConfig validation with a did-you-mean and the allowed keys.
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rla_ablate.config.yamlio import LocatedYAML, format_validation_error
from rla_ablate.errors import UserError

SOURCE = "--set"


def parse_assignment(text: str) -> tuple[str, Any]:
    """'a.b=1e-3' -> ('a.b', 0.001); the value is read as YAML (numbers, true/false, null, lists)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"expected KEY=VALUE with a dotted key such as train.tokens=200000, got {text!r}",
                        file=SOURCE)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # YAML 1.1 reads 1e-3 as a string; a number is what anyone writing it means.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            pass
    return key, value


def set_dotted(tree: dict, key: str, value: Any) -> None:
    """Set `key` (dots between levels, integers index lists) in nested dicts and lists, creating dict levels."""
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) > len(node):
                raise UserError(f"'{parts[depth - 1]}' is a list of {len(node)}; use an index 0..{len(node) - 1}, "
                                f"or {len(node)} to add an entry", file=SOURCE, key=where)
            index = int(part)
            if index == len(node):
                node.append({})
            if last:
                node[index] = value
            else:
                node = node[index]
            continue
        if not isinstance(node, dict):
            raise UserError(f"'{parts[depth - 1]}' is a value, not a section", file=SOURCE, key=where)
        if last:
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]


def apply_overrides(model: type[BaseModel], data: dict, assignments: list[str]):
    """Validate `data` with every assignment applied; errors name the --set key, with a did-you-mean."""
    for text in assignments:
        key, value = parse_assignment(text)
        top = key.split(".")[0]
        if top not in model.model_fields:
            allowed = sorted(model.model_fields)
            close = difflib.get_close_matches(top, allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"unknown section '{top}'{hint}; allowed: {', '.join(allowed)}", file=SOURCE, key=key)
        set_dotted(data, key, value)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, model, LocatedYAML(data=data, file=SOURCE)) from None
