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
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rla_ablate.errors import UserError, closest, did_you_mean


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


# Top-level keys only a sweep file has: a file holding one, given where a data config or a model preset goes, is
# said to be a sweep file rather than checked key by key
SWEEP_FILE_KEYS = frozenset({"models", "base", "grid", "seeds", "search"})


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


# PyYAML's context of an error that is a '[', '{' or quote never closed: its context_mark is where it opened.
_UNCLOSED = ("while parsing a flow sequence", "while parsing a flow mapping", "while scanning a quoted scalar")


def _yaml_error(exc: yaml.YAMLError, text: str, file: str) -> UserError:
    """A PyYAML error as a UserError. PyYAML finds an unclosed '[' where the text stops making sense, often on a
    later line (the next key's ':'); the message points at the line where it opened instead, with its key."""
    problem_mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if getattr(exc, "context", None) in _UNCLOSED and context_mark is not None and problem_mark is not None:
        opener = text[context_mark.index] if context_mark.index < len(text) else ""
        what = f"the {opener!r} opened here" if opener in ("[", "{", "'", '"') else "what opens here"
        return UserError(f"malformed YAML: {what} is not closed ({problem} on line {problem_mark.line + 1})",
                         file=file, line=context_mark.line + 1, key=_key_at(text, context_mark))
    if "another document" in problem:  # PyYAML: "expected a single document in the stream / but found another"
        return UserError("a second YAML document starts here ('---'); the file must hold one document: remove the "
                         "'---' and what follows, or split the file", file=file,
                         line=problem_mark.line + 1 if problem_mark is not None else None)
    return UserError(f"malformed YAML: {problem}", file=file,
                     line=problem_mark.line + 1 if problem_mark is not None else None)


def _key_at(text: str, mark: Any) -> str | None:
    """The dotted key of the value that starts at `mark`, told from the parse events before the error (a value that
    is still being read when it fails, such as an unclosed quoted string, is the one the parser is at); None at the
    top level or when it cannot be told."""
    frames: list[list] = []  # per open collection: [is a mapping, its current key or index, a key comes next]

    def key(path: list) -> str | None:
        return ".".join(str(p) for p in path) or None

    try:
        for ev in yaml.parse(text, Loader=Loader):
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frames.pop()
                continue
            if not isinstance(ev, yaml.NodeEvent):
                continue
            is_key = False
            if frames and frames[-1][0]:
                is_key = frames[-1][2]
                frames[-1][2] = not is_key
                if is_key:
                    frames[-1][1] = ev.value if isinstance(ev, yaml.ScalarEvent) else "?"
            elif frames:
                frames[-1][1] += 1
            if not is_key and (ev.start_mark.line, ev.start_mark.column) == (mark.line, mark.column):
                return key([f[1] for f in frames])
            if isinstance(ev, yaml.MappingStartEvent):
                frames.append([True, None, True])
            elif isinstance(ev, yaml.SequenceStartEvent):
                frames.append([False, -1, False])
    except yaml.YAMLError:
        pass
    if frames and frames[-1][0] and frames[-1][2]:
        return None
    path = [f[1] for f in frames]
    if frames and not frames[-1][0]:
        path[-1] += 1
    return key(path)


def load_yaml_text(text: str, file: str) -> LocatedYAML:
    try:
        node = yaml.compose(text, Loader=Loader)
        data = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, file) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index(node, (), lines, file)
    return LocatedYAML(data=data, file=file, lines=lines)


def check_file(path: str | Path, what: str = "a YAML file") -> None:
    """A UserError unless `path` is a file: a folder is named as one, with the YAML files in it; `what` is what
    was expected instead (e.g. "a sweep file (YAML)")."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        listing = f" (it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})" if inside else ""
        raise UserError(f"is a folder, not a file; expected {what}{listing}", file=str(path))
    if not path.is_file():
        # a device, a pipe or a socket exists without being a file to read a config from
        raise UserError(f"not a regular file; expected {what}" if path.exists() else "no such file", file=str(path))


def load_yaml(path: str | Path) -> LocatedYAML:
    path = Path(path)
    check_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise UserError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                        "save the file as UTF-8", file=str(path), line=line) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", file=str(path)) from None
    return load_yaml_text(text, str(path))


def _members(annotation: Any) -> list[Any]:
    """The types a value at `annotation` may take: the members of a union (without None), else the type itself;
    Annotated is looked through."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) if a is not type(None) for m in _members(a)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _member_named(members: list[Any], tag: str) -> Any:
    """The union member pydantic names `tag` in an error location: a model by its class name, or the model whose
    Literal field holds the tag of a discriminated union (kind: text); None for other members (str, a Literal)."""
    for m in members:
        if _is_model(m) and (m.__name__ == tag or any(
                typing.get_origin(f.annotation) is typing.Literal and tag in typing.get_args(f.annotation)
                for f in m.model_fields.values())):
            return m
    return None


def _walk(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, tuple, tuple[int, str] | None]:
    """The model that owns the last key of `loc`; `loc` as the user wrote it, without the union members pydantic
    names in it ('ControlRef', "literal['auto']", a discriminator value such as 'stdlib'); and where the first such
    member was named: (its position in the path as written, the member's name), or None."""
    owner, annotation, shown, union = None, model, [], None
    for part in loc:
        if part == "[key]":  # a mapping's key refused: said at the key, as written
            continue
        members = _members(annotation)
        if len(members) > 1 and isinstance(part, str):
            if union is None:
                union = (len(shown), part)
            annotation = _member_named(members, part)
            continue
        annotation = members[0]
        shown.append(part)
        args = typing.get_args(annotation)
        if _is_model(annotation) and isinstance(part, str):
            owner = annotation
            f = annotation.model_fields.get(part)
            annotation = f.annotation if f else None
        elif typing.get_origin(annotation) in (list, tuple, set, frozenset) and args:
            annotation = args[0]
        elif typing.get_origin(annotation) is dict and len(args) == 2:
            annotation = args[1]
        else:
            annotation = None
    return owner, tuple(shown), union


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the last key of `loc` (for listing allowed keys)."""
    return _walk(model, loc)[0]


def user_loc(exc: ValidationError, model: type[BaseModel]) -> tuple:
    """Where the first problem of `exc` (raised validating `model`) is, as the user wrote it: no validator entries, no
    union members, and not a required key that a misspelt one stands for (`_errors`)."""
    return _walk(model, _errors(exc, model)[0][1])[1]


def _choices(err: dict, field: str = "expected") -> list[str]:
    """The allowed values pydantic lists in an error's context (`expected`; a union's tags: `expected_tags`)."""
    expected = str((err.get("ctx") or {}).get(field, ""))
    return [c.strip(" '") for c in re.split(r",| or ", expected) if c.strip(" '")]


def _describe(err: dict, model: type[BaseModel], loc: tuple, name: str | None = None, list_allowed: bool = True) -> str:
    """What is wrong, in words: an unknown key (called `name`, default its last part) with a did-you-mean and the
    allowed keys (unless `list_allowed` is False), a value outside its choices with them, else pydantic's message."""
    got = err.get("input")
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, loc)
        allowed = sorted(owner.model_fields) if owner else []
        shown = str(loc[-1]) if name is None else name
        # a key that belongs elsewhere in this config (a sweep's `train:` under `base:`): where, before any spelling
        moved = getattr(owner, "KEYS_ELSEWHERE", {}).get(str(loc[-1])) if owner else None
        # the suggestion is written as the key is: with the same path before it
        hint = (f" ({moved})" if moved else
                did_you_mean(str(loc[-1]), allowed, prefix=shown[:-len(str(loc[-1]))]))
        msg = f"unknown key '{shown}'{hint}"
        return msg + (f"; allowed: {', '.join(allowed)}" if allowed and list_allowed else "")
    if err["type"] in ("literal_error", "enum"):
        choices = _choices(err)
        shown = _walk(model, loc)[1]
        # An entry of a list of names (controls: [matched_state]) reads like an unknown ablation does; only a plain
        # plural is made singular (controls -> control), anything else keeps the generic wording.
        plural = str(shown[-2]) if len(shown) >= 2 and isinstance(shown[-1], int) else ""
        if plural.endswith("s") and not plural.endswith(("ss", "us", "ies", "ses", "xes")):
            return (f"unknown {plural[:-1]} {got!r}{did_you_mean(str(got), choices)}; "
                    f"allowed: {', '.join(choices)}")
        return f"{got!r} is not allowed{did_you_mean(str(got), choices)}; allowed: {', '.join(choices)}"
    if err["type"] == "union_tag_invalid":  # a discriminated union's tag (data: {kind: stdlb})
        ctx = err.get("ctx") or {}
        tags, tag = _choices(err, "expected_tags"), str(ctx.get("tag", got))
        key = str(ctx.get("discriminator", "kind")).strip("'")
        return f"unknown {key} {tag!r}{did_you_mean(tag, tags)}; allowed: {', '.join(tags)}"
    if got is None and err["type"] in ("list_type", "dict_type", "model_type", "model_attributes_type"):
        # `ablations:` with nothing under it (its entries deleted or commented out) is YAML's null
        empty = "[]" if err["type"] == "list_type" else "{}"
        return f"has no value (nothing under the key); give its entries, write {empty} for none, or delete the key"
    if err["type"] == "value_error":
        msg = err["msg"].removeprefix("Value error, ")
    elif err["type"] == "model_type":
        msg = "Input should be a mapping"
    else:
        msg = err["msg"]
    if err["type"] != "missing" and not isinstance(got, (dict, list)):
        # as the file spells it: YAML's true, false and null, not Python's True, False and None
        shown = {True: "true", False: "false"}[got] if isinstance(got, bool) else "null" if got is None else repr(got)
        if len(shown) > 80:  # a text file read as YAML is one long string: its start says what it is
            shown = f"{shown[:60]}... ({len(str(got)):,} characters)"
        msg += f" (got {shown})"
    return msg


def _loc(err: Any) -> tuple:
    """An error's location without pydantic's validator entries."""
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def _expected(err: dict) -> str:
    """What one member of a union wanted, for a message that names every member's ("a valid number or 'auto'")."""
    if err["type"] in ("literal_error", "enum"):
        return " or ".join(repr(c) for c in _choices(err))
    if err["type"] == "model_type":
        return "a mapping"
    return err["msg"].removeprefix("Input should be ").split(",")[0]


def _errors(exc: ValidationError, model: type[BaseModel]) -> list[tuple[dict, tuple]]:
    """The errors of `exc` with their locations (without validator entries), one per problem. pydantic reports a
    value that fits no member of a union once per member (controls: [matched_stat] is neither a ControlRef mapping
    nor one of the names); of those only the members the value was meant for count: the ones with errors inside the
    value (it has its shape), else the ones whose error is not about the value's type (a name that is not one of the
    allowed ones). When several members are left, one error says what each would take ("a valid number or 'auto'")."""
    errs = [(err, _loc(err)) for err in exc.errors()]
    unions: dict[tuple, list[int]] = {}
    depth, tag = {}, {}
    for i, (_, loc) in enumerate(errs):
        _, shown, union = _walk(model, loc)
        if union is not None:
            unions.setdefault(shown[:union[0]], []).append(i)
            depth[i], tag[i] = len(shown) - union[0], union[1]
    drop: set[int] = set()
    merged: dict[int, dict] = {}
    for idx in unions.values():
        deep = {tag[i] for i in idx if depth[i] > 0}
        keep = deep or {tag[i] for i in idx if not errs[i][0]["type"].endswith("_type")} or {tag[i] for i in idx}
        drop |= {i for i in idx if tag[i] not in keep}
        left = [i for i in idx if tag[i] in keep]
        if len(keep) > 1 and not deep:
            wanted = dict.fromkeys(_expected(errs[i][0]) for i in left)
            merged[left[0]] = {"type": "union", "input": errs[left[0]][0].get("input"),
                               "msg": "Input should be " + " or ".join(wanted)}
            drop |= set(left[1:])
    # a misspelt required key (hiden_size) is one problem: the unknown key with its did-you-mean, not also the
    # required key it was meant to be as missing
    missing = {loc: i for i, (err, loc) in enumerate(errs) if err["type"] == "missing"}
    for err, loc in errs:
        owner = _model_at(model, loc) if err["type"] == "extra_forbidden" and loc else None
        close = closest(str(loc[-1]), owner.model_fields) if owner else []
        if close and loc[:-1] + (close[0],) in missing:
            drop.add(missing[loc[:-1] + (close[0],)])
    return [(merged.get(i, err), loc) for i, (err, loc) in enumerate(errs) if i not in drop]


def validation_message(exc: ValidationError, model: type[BaseModel], prefix: str = "", at: str | None = None) -> str:
    """Every problem of `exc` (raised validating `model`) in one line for a message that points elsewhere (a sweep
    file's grid key): `key: what` joined by "; ", an unknown key as `unknown key 'key'` with a did-you-mean and,
    once per section, the allowed keys. Keys are written as the user wrote them, after `prefix` (e.g. "model.");
    a problem at key `at`, the one the message is reported at, is written without it."""
    parts, listed = [], []
    for err, loc in _errors(exc, model):
        dotted = ".".join(str(p) for p in _walk(model, loc)[1])
        key = prefix + dotted if dotted else prefix.rstrip(".")
        if err["type"] == "extra_forbidden" and loc:
            owner = _model_at(model, loc)
            # at its own line under a section (base.train.tokns) the key is written as in the file, its last part;
            # a swept key (train.lrr, no prefix) is written whole, as the grid spells it
            name = None if key == at and prefix else key
            parts.append(_describe(err, model, loc, name=name, list_allowed=owner not in listed))
            listed.append(owner)
        else:
            msg = _describe(err, model, loc)
            parts.append(f"{key}: {msg}" if key and key != at else msg)
    return "; ".join(parts)


def count_problems(exc: ValidationError, model: type[BaseModel]) -> int:
    """How many problems `exc` (raised validating `model`) reports to the user (`_errors`)."""
    return len(_errors(exc, model))


def format_validation_error(exc: ValidationError, model: type[BaseModel], located: LocatedYAML,
                            where: Callable[[tuple], tuple] | None = None) -> UserError:
    """Every problem of `exc` at its line and key; `where` maps a problem's path in `model` to the path of the file
    it was read from (a sweep's job validated from its `base:` section: ('base',) + path), default the same."""
    problems = []
    for err, loc in _errors(exc, model):
        shown = _walk(model, loc)[1]
        if where is not None:
            shown = where(shown)
        # a problem of the whole config (a check across its sections) is said without a key
        problems.append((located.line(shown), ".".join(str(p) for p in shown) or None, _describe(err, model, loc)))
    if len(problems) == 1:
        line, key, msg = problems[0]
        return UserError(msg, file=located.file, line=line, key=key)
    problems.sort(key=lambda p: (p[0] is None, p[0] or 0))  # in the file's order, as it is read
    body = "\n".join(f"{located.file}{f':{line}' if line else ''}: {f'{key}: ' if key else ''}{msg}"
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
