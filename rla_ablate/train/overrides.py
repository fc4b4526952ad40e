"""`--set key=value` overrides: dotted keys into a JobConfig dict (`rla_ablate.config.dotted`, the engine the
sweep expansion uses too), values parsed as YAML scalars.

    train.tokens=200000    model.fit=none    eval.0.tokens=8192    data.glob='**/*.md'
    eval.1.name=mqar  eval.1.data.kind=mqar        (index = length of the list: a new entry)

Unknown keys are reported by the JobConfig validation with a did-you-mean and the allowed keys.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rla_ablate.config.dotted import KeyPathError, set_dotted
from rla_ablate.config.yamlio import LocatedYAML, format_validation_error
from rla_ablate.errors import UserError, did_you_mean

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
    except yaml.YAMLError as exc:
        if raw.strip().startswith(("{", "[")):  # meant as a mapping or a list: its typo, not "not a mapping"
            where = getattr(exc, "problem_mark", None)
            at = f" at column {where.column + 1}" if where is not None else ""
            shape = "a mapping is {key: value, ...}" if raw.strip()[0] == "{" else "a list is [a, b, ...]"
            raise UserError(f"the value {raw.strip()!r} is not valid YAML{at}: "
                            f"{getattr(exc, 'problem', None) or exc} ({shape})", file=SOURCE, key=key) from None
        value = raw
    # YAML 1.1 reads 1e-3 as a string; a number is what anyone writing it means.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            pass
    return key, value


def apply_overrides(model: type[BaseModel], data: dict, assignments: list[str]):
    """Validate `data` with every assignment applied; errors name the --set key, with a did-you-mean."""
    for text in assignments:
        key, value = parse_assignment(text)
        top = key.split(".")[0]
        if top not in model.model_fields:
            allowed = sorted(model.model_fields)
            raise UserError(f"unknown section '{top}'{did_you_mean(top, allowed)}; allowed: {', '.join(allowed)}",
                            file=SOURCE, key=key)
        try:
            set_dotted(data, key, value)
        except KeyPathError as exc:
            raise UserError(str(exc), file=SOURCE, key=exc.key) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, model, LocatedYAML(data=data, file=SOURCE)) from None
