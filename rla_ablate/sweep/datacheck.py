"""The plan-time dry run of a sweep's data: every distinct training data config and eval set of the expanded jobs is
opened once and must yield a batch, so a config that cannot work (an empty validation split, a shard folder with a
file missing, a corpus shorter than one window) is reported before anything runs, at the sweep file's line.

Configs are deduplicated by their canonical JSON and the sequence length they are read at: a sweep of a hundred
jobs over one corpus opens it once. Text-like sources are tokenized in memory when opened (what every job does
first), shards are memory-mapped, recall tasks generate their examples.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rla_ablate.errors import UserError
from rla_ablate.sweep.expand import ResolvedJob, Sweep
from rla_ablate.sweep.ids import canonical_json


@dataclass
class DataCheck:
    """What the dry run opened."""

    data: int = 0
    """Distinct training data configs (per sequence length), each of which yielded a batch."""
    evals: int = 0
    """Distinct eval sets (per sequence length), each of which yielded its batches."""
    seconds: float = 0.0

    def line(self) -> str:
        return (f"data: {self.data} training data config{'s' * (self.data != 1)} and {self.evals} eval "
                f"set{'s' * (self.evals != 1)} each yielded a batch ({self.seconds:.1f} s)")


def _section_path(sweep: Sweep, job: ResolvedJob, section: str) -> tuple:
    """Where the job's `data` or `eval` section comes from in the sweep file: a grid/zip/search key that sets part
    of it, the arm's own base, or the shared base."""
    cfg = sweep.config
    for key in job.point:
        if key == section or key.startswith(section + "."):
            if key in cfg.grid:
                return ("grid", key)
            if key in cfg.zip:
                return ("zip", key)
            return ("search", "params", key)
    if 0 <= job.arm < len(cfg.models) and section in cfg.models[job.arm].base:
        return ("models", job.arm, "base", section)
    return ("base", section)


def _fail(sweep: Sweep, path: tuple, what: str, exc: BaseException, users: list[str]) -> UserError:
    if isinstance(exc, UserError):
        detail = exc.message
        # The loader names the data key at fault (split, glob, path, ...): point at it when the section is in
        # the file as written, not produced by a grid key.
        if exc.key and path[0] != "grid" and path[0] != "zip" and path[0] != "search" and exc.key != "data":
            path = path + (exc.key,)
    else:
        detail = f"{type(exc).__name__}: {exc}"
    more = f" and {len(users) - 1} more" if len(users) > 1 else ""
    return UserError(f"{what} cannot be read: {detail} (job {users[0]}{more}; checked at plan time, before "
                     "anything runs)", file=sweep.source.file, line=sweep.source.line(path),
                     key=".".join(str(p) for p in path))


def check_data(sweep: Sweep, jobs: Iterable[ResolvedJob] | None = None) -> DataCheck:
    """Open every distinct data config and eval set of `jobs` (default: all of the sweep's) and take a batch;
    raise a `UserError` naming the sweep file's line and key of the first one that fails."""
    from rla_ablate.data import make_eval_batches, make_train_stream

    t0 = time.monotonic()
    jobs = list(sweep.jobs if jobs is None else jobs)
    # key -> (what, path, users, opener)
    checks: dict[tuple, list[Any]] = {}
    json_of: dict[int, str] = {}

    def cjson(obj: Any) -> str:
        # Jobs of one point share their config objects: hash each object once.
        if id(obj) not in json_of:
            json_of[id(obj)] = canonical_json(obj)
        return json_of[id(obj)]

    for job in jobs:
        cfg: Any = job.job  # a rla_ablate.train.JobConfig
        train, data = cfg.train, cfg.data
        key = ("data", cjson(data), train.seq_len)
        if key not in checks:
            def open_train(data=data, train=train) -> None:
                next(make_train_stream(data, train.seq_len, max(1, min(train.micro_batch_size, 4)), train.seed))
            checks[key] = [f"the training data (kind {data.kind})", _section_path(sweep, job, "data"), [], open_train]
        checks[key][2].append(job.name)
        for i, ev in enumerate(cfg.eval):
            key = ("eval", cjson(ev), train.seq_len)
            if key not in checks:
                def open_eval(ev=ev, train=train) -> None:
                    if not make_eval_batches(ev, train.seq_len, max(1, train.micro_batch_size)):
                        raise UserError("it yields no batch", key="data")
                base = _section_path(sweep, job, "eval")
                path = base + (i, "data") if base[-1] == "eval" else base
                checks[key] = [f"the eval set '{ev.name}' (kind {ev.data.kind})", path, [], open_eval]
            checks[key][2].append(job.name)
    out = DataCheck()
    for key, (what, path, users, opener) in checks.items():
        try:
            opener()
        except Exception as exc:  # noqa: BLE001 - any failure to read is the config's, reported at its line
            raise _fail(sweep, path, what, exc, users) from None
        if key[0] == "data":
            out.data += 1
        else:
            out.evals += 1
    out.seconds = time.monotonic() - t0
    return out
