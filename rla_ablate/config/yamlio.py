"""Safe YAML loading that remembers where every key is, so validation errors can name file and line.

`load_yaml(path)` returns a `LocatedYAML`: the plain data (as `yaml.safe_load` gives it) and a
`line(path)` lookup from a key path such as ("train", "lr") to its 1-based line.
`validate(model, located)` turns pydantic errors into one `UserError` that names file, line, key,
what was wrong and, for unknown keys, the allowed keys with a did-you-mean.
Two departures from YAML 1.1 (PyYAML): a key repeated in one mapping is an error naming both lines (1.1 keeps
the last silently), and `1e5` / `1.0e5` are numbers (1.1 wants a dot and a signed exponent, else a string).
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rla_ablate.errors import UserError, did_you_mean


class Loader(yaml.SafeLoader):
    """SafeLoader that also reads scientific notation without a dot or exponent sign as a float."""


# YAML 1.2 reads these as floats; YAML 1.1 leaves `tokens: 1e5` a string that validation would then reject.
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_value(text: str) -> Any:
    """One YAML value with the project's rules (command-line overrides such as `train.tokens=1e5`)."""
    return yaml.load(text, Loader=Loader)


@dataclass
class LocatedYAML:
    data: Any
    file: str
    lines: dict[tuple, int] = field(default_factory=dict)

    def line(self, path: tuple) -> int | None:
        """Line of the deepest known prefix of `path` (an unknown key still points at its parent)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _index(node: yaml.Node, prefix: tuple, out: dict[tuple, int], file: str) -> None:
    out.setdefault(prefix, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key in seen:
                    name = ".".join(str(p) for p in prefix + (key,))
                    raise UserError(f"duplicate key '{key}' (first on line {seen[key]}, again on line {line})",
                                    file=file, line=line, key=name)
                seen[key] = line
            out[prefix + (key,)] = key_node.start_mark.line + 1
            _index(value_node, prefix + (key,), out, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, prefix + (i,), out, file)


def load_yaml_text(text: str, file: str) -> LocatedYAML:
    try:
        node = yaml.compose(text, Loader=Loader)
        data = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"malformed YAML: {problem}", file=file, line=line) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index(node, (), lines, file)
    return LocatedYAML(data=data, file=file, lines=lines)


def load_yaml(path: str | Path) -> LocatedYAML:
    path = Path(path)
    if not path.is_file():
        raise UserError("no such file", file=str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise UserError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                        "save the file as UTF-8", file=str(path), line=line) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", file=str(path)) from None
    return load_yaml_text(text, str(path))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation, looking through Optional, Union, list, dict and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_tag(part: Any, candidates: list[type[BaseModel]]) -> bool:
    """A discriminated union puts the chosen member's tag (a Literal value, e.g. kind: text) in the location."""
    if not isinstance(part, str) or len(candidates) < 2 or any(part in m.model_fields for m in candidates):
        return False
    return any(part in typing.get_args(f.annotation) for m in candidates for f in m.model_fields.values()
               if typing.get_origin(f.annotation) is typing.Literal)


def _walk(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, tuple]:
    """The model that owns the last key of `loc`, and `loc` as the user wrote it (union tags removed)."""
    owner, candidates, shown = None, [model], []
    for part in loc:
        if _is_tag(part, candidates):
            candidates = [m for m in candidates if any(part in typing.get_args(f.annotation)
                                                       for f in m.model_fields.values())]
            continue
        shown.append(part)
        if isinstance(part, int):
            continue
        owner = candidates[0] if candidates else None
        f = owner.model_fields.get(part) if owner else None
        candidates = _models_in(f.annotation) if f else []
    return owner, tuple(shown)


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the last key of `loc` (for listing allowed keys)."""
    return _walk(model, loc)[0]


def _describe(err: dict, model: type[BaseModel], loc: tuple, name: str | None = None, list_allowed: bool = True) -> str:
    """What is wrong, in words: an unknown key (called `name`, default its last part) with a did-you-mean and the
    allowed keys (unless `list_allowed` is False), a value outside its choices with them, else pydantic's message."""
    got = err.get("input")
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, loc)
        allowed = sorted(owner.model_fields) if owner else []
        msg = f"unknown key '{loc[-1] if name is None else name}'{did_you_mean(str(loc[-1]), allowed)}"
        return msg + (f"; allowed: {', '.join(allowed)}" if allowed and list_allowed else "")
    if err["type"] in ("literal_error", "enum"):
        expected = str((err.get("ctx") or {}).get("expected", ""))
        choices = [c.strip(" '") for c in re.split(r",| or ", expected) if c.strip(" '")]
        return f"{got!r} is not allowed; allowed: {', '.join(choices)}{did_you_mean(str(got), choices)}"
    msg = err["msg"]
    if err["type"] != "missing" and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return msg


def _loc(err: Any) -> tuple:
    """An error's location without pydantic's validator entries."""
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def validation_message(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """Every problem of `exc` (raised validating `model`) in one line for a message that points elsewhere (a sweep
    file's grid key): `key: what` joined by "; ", an unknown key as `unknown key 'key'` with a did-you-mean and,
    once per section, the allowed keys. Keys are written as the user wrote them, after `prefix` (e.g. "model.")."""
    parts, listed = [], []
    for err in exc.errors():
        loc = _loc(err)
        dotted = ".".join(str(p) for p in _walk(model, loc)[1])
        key = prefix + dotted if dotted else prefix.rstrip(".")
        if err["type"] == "extra_forbidden" and loc:
            owner = _model_at(model, loc)
            parts.append(_describe(err, model, loc, name=key, list_allowed=owner not in listed))
            listed.append(owner)
        else:
            msg = _describe(err, model, loc)
            parts.append(f"{key}: {msg}" if key else msg)
    return "; ".join(parts)


def format_validation_error(exc: ValidationError, model: type[BaseModel], located: LocatedYAML) -> UserError:
    problems = []
    for err in exc.errors():
        loc = _loc(err)
        shown = _walk(model, loc)[1]
        problems.append((located.line(shown), ".".join(str(p) for p in shown) or "(top level)",
                         _describe(err, model, loc)))
    if len(problems) == 1:
        line, key, msg = problems[0]
        return UserError(msg, file=located.file, line=line, key=key)
    body = "\n".join(f"{located.file}:{line}: {key}: {msg}" if line else f"{located.file}: {key}: {msg}"
                     for line, key, msg in problems)
    return UserError(f"{len(problems)} problems\n{body}", file=located.file)


def validate(model: type[BaseModel], located: LocatedYAML, data: Any = None):
    """Validate `data` (default: the located YAML's data) against `model`; errors name file and line."""
    payload = located.data if data is None else data
    if payload is None:
        payload = {}
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise format_validation_error(exc, model, located) from None
    except ValueError as exc:
        raise UserError(str(exc), file=located.file) from None
