"""`rla-sweep train MODEL --out DIR`: one training job without a sweep, with a progress bar.

Rerunning the same command resumes from the newest checkpoint in DIR; Ctrl-C stops at the next step with a
checkpoint. `--set` takes dotted JobConfig keys (train.tokens=200000, model.fit=none, eval.0.tokens=8192).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import signal
from pathlib import Path

# Training profiles: starting points applied before --set. "cpu" is a short run a laptop finishes in seconds
# with the tiny presets; "paper" is TrainConfig's defaults (paper App. C, 50B tokens).
PROFILES: dict[str, list[str]] = {
    "paper": [],
    "cpu": [
        "train.tokens=262144", "train.seq_len=128", "train.micro_batch_size=8", "train.batch_tokens=4096",
        "train.lr=3e-3", "train.min_lr=3e-4", "eval.0.tokens=16384",
    ],
}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train one model (no sweep), resumable, with a progress bar",
        description="Train one model on a token budget and evaluate it: metrics in OUT/metrics.jsonl, checkpoints "
                    "in OUT/checkpoints. Running the same command again resumes from the newest checkpoint.")
    parser.add_argument("model", metavar="MODEL", help="a model preset name (tiny-rla) or YAML path (models/tiny-rla.yaml)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for metrics.jsonl, job.json and checkpoints")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a JobConfig key, e.g. train.tokens=200000, model.fit=none, data.split=train "
                             "(repeatable; applied after the profile)")
    parser.add_argument("--data", metavar="DATA",
                        help="training data: stdlib (default), mqar, niah, a text file or folder, a JSON Lines file "
                             "or folder (records' 'text'), a shards folder (index.json), a dataset saved with "
                             "save_to_disk, or a YAML file with a data config")
    parser.add_argument("--profile", choices=["auto", *PROFILES], default="auto",
                        help="training defaults: cpu (a short run: 262K tokens, seq_len 128) or paper (App. C: "
                             "50B tokens, 4M-token batches); auto = cpu without CUDA, paper with it")
    parser.set_defaults(func=run)


def data_config(spec: str | None) -> dict:
    """The data config dict named by --data."""
    from rla_ablate.config import load_yaml
    from rla_ablate.errors import UserError

    from rla_ablate.commands.data import SHORTHANDS

    if spec is None or spec in SHORTHANDS:
        return {"kind": spec or "stdlib"}
    path = Path(spec)
    if not path.exists():
        raise UserError("no such file or folder; --data takes stdlib, mqar, niah, a text file or folder, a JSON Lines "
                        "file or folder, a shards folder, a dataset saved with save_to_disk, or a YAML data config",
                        file=spec, key="--data")
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        from rla_ablate.commands.data import validate_data_file

        located = load_yaml(path)
        if not isinstance(located.data, dict):
            raise UserError("a data config is a mapping with a 'kind' key, e.g. {kind: text, path: corpus/}",
                            file=spec, line=1)
        others = [k for k in located.data if k != "data"] if "data" in located.data else []
        if others:  # a job's other sections (eval:) would be dropped without a word
            raise UserError(f"holds {', '.join(map(str, others))} beside data: --data reads a data config alone "
                            "(it replaces the training data; eval sets are given with --set 'eval.0={name: ..., "
                            "data: {...}}')", file=located.file, line=located.lines.get((others[0],)),
                            key=str(others[0]))
        # checked here, so that a mistake is reported at its line in this file (not as a --set problem)
        return dict(validate_data_file(located)[0])
    if path.is_dir() and (path / "index.json").is_file():
        return {"kind": "shards", "path": str(path)}
    if path.is_dir() and any(path.glob("tokens-*.bin")):
        raise UserError("holds token shards but no index.json: a `data prepare` that did not finish (index.json is "
                        "written last); run it again", file=spec, key="--data")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        return {"kind": "hf_disk", "path": str(path)}
    from rla_ablate.data.sources import folder_data, json_lines

    if path.is_file():
        return {"kind": "jsonl" if json_lines(path) else "text", "path": str(path)}
    try:
        return folder_data(path)
    except UserError as exc:
        raise UserError(exc.message, key="--data") from None


def build_job(model: str, sets: list[str], data: str | None, profile: str):
    """The resolved JobConfig: preset, then profile, then --data, then --set."""
    from rla_ablate.models import load_preset
    from rla_ablate.train import JobConfig
    from rla_ablate.train.job import DEFAULT_EVAL
    from rla_ablate.train.overrides import apply_overrides

    base = {
        "model": load_preset(model).model_dump(),
        "train": {},
        "data": data_config(data),
        "eval": copy.deepcopy(list(DEFAULT_EVAL)),  # --set eval.0.data.split=... writes into the copy
    }
    return apply_overrides(JobConfig, base, PROFILES[profile] + list(sets))


def _summary(console, result, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{result.status} after {result.tokens_done:,} tokens", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = [k for k in result.metrics if k.startswith(("eval/", "train/loss", "train/tokens_per_s", "train/mfu"))]
    for key in sorted(keys):
        table.add_row(key, f"{result.metrics[key]:.6g}")
    console.print(table)
    console.print(f"metrics: {out / 'metrics.jsonl'}   checkpoints: {out / 'checkpoints'}")


def _same_job(out: Path, job, checkpoints: bool) -> None:
    """A folder resumes only the job that wrote it: with checkpoints, or with a metrics.jsonl of records, another
    job is refused before its job.json (which records that job) is overwritten, naming the keys that differ. A run
    that finished and whose checkpoints are gone is refused too: training again would replace its record; so is a
    metrics.jsonl without a job.json, whose job cannot be told."""
    from pydantic import ValidationError

    from rla_ablate.errors import UserError
    from rla_ablate.train import JobConfig, read_jsonl
    from rla_ablate.train.job import another_job
    from rla_ablate.train.loggers import last_close

    records = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    if not checkpoints and not records:
        return  # nothing of an earlier run to keep
    closed = last_close(records)
    if not checkpoints and closed and closed.get("status") == "finished":
        raise UserError(f"{out} holds a finished run (metrics.jsonl) whose checkpoints are gone: training again "
                        f"would replace its record; move {out / 'metrics.jsonl'} away to train it again, or use a new "
                        "--out folder", key="--out")
    held = "checkpoints" if checkpoints else "the metrics of a run (metrics.jsonl)"
    try:
        before = JobConfig.model_validate_json((out / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        before = None  # no readable record: a checkpoint's own copy is checked when the job loads it
    if before is None and not checkpoints:
        # metrics.jsonl and no job.json (which `train` writes before its first record): whose they are is unknown
        raise UserError(f"{out} holds the metrics of a run (metrics.jsonl) and no readable job.json recording its "
                        f"job: training here would replace them; move {out / 'metrics.jsonl'} away, or use a new "
                        "--out folder", key="--out")
    if before is not None and before.identity_json() != job.identity_json():
        raise UserError(f"{out} holds {held} of {another_job(job.identity_json(), before.identity_json())}",
                        key="--out")


class _OutLock:
    """One `train` at a time in a folder: a flock on OUT/train.lock, which the kernel drops when the process dies.
    Two trainings in one folder would write one job.json, metrics.jsonl and checkpoints over each other."""

    def __init__(self, out: Path):
        self.path = out / "train.lock"
        self.fd: int | None = None

    def __enter__(self) -> "_OutLock":
        import os

        from rla_ablate.errors import UserError
        from rla_ablate.fileio import LockHeld, lock_exclusive

        try:
            self.fd = lock_exclusive(self.path)
        except LockHeld:
            pid = self.path.read_text(errors="replace").strip() or "?"
            raise UserError(f"another `rla-sweep train` (pid {pid}) is training in {self.path.parent}; wait for it, "
                            "or stop it (Ctrl-C there, or kill it: it checkpoints), then rerun this command to "
                            "resume", key="--out") from None
        except OSError as exc:
            raise UserError(f"cannot write the folder ({exc.strerror or exc})", file=str(self.path.parent),
                            key="--out") from None
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, f"{os.getpid()}\n".encode())
        return self

    def __exit__(self, *exc) -> None:
        from rla_ablate.fileio import unlock

        unlock(self.fd)
        self.fd = None


def run(args: argparse.Namespace) -> int:
    import torch

    from rla_ablate.errors import UserError
    from rla_ablate.fileio import check_folder, make_folder
    from rla_ablate.models import count_params
    from rla_ablate.terminal import PipeConsole, count
    from rla_ablate.train.checkpoint import is_whole, list_checkpoints
    from rla_ablate.train.loop import check_device

    profile = args.profile
    if profile == "auto":
        profile = "paper" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    what = "the job (checkpoints, metrics.jsonl)"
    check_folder(out, "--out", what)
    job = build_job(args.model, args.sets, args.data, profile)
    dropped = False
    evals_set = any(a.split("=", 1)[0].strip().startswith("eval") for a in args.sets)  # chosen by --set
    if args.data and not evals_set:
        from rla_ablate.data import tokenizer_mismatch

        # the built-in eval set scores bytes: with --data of another tokenizer it would score ids never trained on
        if any(tokenizer_mismatch(job.data, e.data) for e in job.eval):
            job, dropped = job.model_copy(update={"eval": []}), True
    check_device(job.train)
    # A reader that goes away (`2>&1 | head`) stops the job gracefully: a checkpoint, then exit 141.
    stop = {"requested": False, "closed": False}
    received = {"signal": signal.SIGINT}  # what stopped it: Ctrl-C (130) or SIGTERM (143)
    console = PipeConsole(stderr=True, on_closed=lambda: stop.update(requested=True, closed=True))
    t = job.train
    console.print(f"[bold]{job.model.family}[/] {args.model}: {count_params(job.model):,} params; profile {profile}"
                  f"{' (auto)' if args.profile == 'auto' else ''}: {t.total_tokens:,} tokens in {count(t.total_steps, 'step')} "
                  f"of {t.batch_tokens:,}, seq_len {t.seq_len}; data {job.data.kind}; eval "
                  + (", ".join(f"{e.name} ({e.data.kind})" for e in job.eval) or "none"), soft_wrap=not console.is_terminal)
    if dropped:
        console.print("note: no eval set: the built-in one reads UTF-8 bytes and --data another tokenizer; "
                      "--set 'eval.0={name: ..., data: {kind: ..., ...}}' evaluates on data tokenized as yours "
                      "(docs/DATA.md)")
    elif any(e.data.kind != job.data.kind for e in job.eval) and not evals_set:
        # --data replaces the training data only: the eval sets stay the profile's (the embedded text's validation
        # split) unless --set eval.0.data... says otherwise
        console.print(f"note: the eval set(s) read other data than training ({job.data.kind}); "
                      "--set 'eval.0={name: ..., data: {kind: ..., ...}}' evaluates on yours (docs/DATA.md)")
    if args.data:  # a tokenizer of fewer ids than the preset's vocabulary: rows of the embedding no token reaches
        from rla_ablate.data import vocab_size

        need = max(vocab_size(c) for c in [job.data, *(e.data for e in job.eval)])
        if need < job.model.vocab_size:
            console.print(f"note: the data's tokens take {need:,} ids and the model's vocab_size is "
                          f"{job.model.vocab_size:,}: {job.model.vocab_size - need:,} embedding rows go unused "
                          f"(--set model.vocab_size={need} fits the model to the data)")
    made = not out.exists()
    make_folder(out, "--out", what)
    with _OutLock(out):
        try:
            done = list_checkpoints(out)
            _same_job(out, job, bool(done))
            if done and not any(is_whole(path) for _, path in done):
                folder = out / "checkpoints"
                what = f"{folder} and {out / 'metrics.jsonl'}" if (out / "metrics.jsonl").is_file() else str(folder)
                raise UserError(f"no checkpoint in {folder} is whole ({count(len(done), 'file')}, each cut short or "
                                f"altered); move {what} away to train the job again from the start", key="--out")
        except UserError:
            if made:
                shutil.rmtree(out, ignore_errors=True)
            raise
        return _train(args, job, out, made, done, console, stop, received)


def _in_model_file(exc, args: argparse.Namespace):
    """A model key found wrong once the data is read (its vocab_size), at its line of the model's YAML file when the
    command named one and --set did not set that key; else `exc` as it is."""
    from rla_ablate.config import load_yaml
    from rla_ablate.errors import UserError

    key = (exc.key or "").removeprefix("model.")
    path = Path(args.model)
    if exc.file is not None or not (exc.key or "").startswith("model.") or path.suffix not in (".yaml", ".yml") \
            or not path.is_file() or any(a.split("=", 1)[0].strip() == exc.key for a in args.sets):
        return exc
    line = load_yaml(path).lines.get(tuple(key.split(".")))
    return UserError(exc.message, file=str(path), line=line, key=key) if line is not None else exc


def _train(args: argparse.Namespace, job, out: Path, made: bool, done: list, console, stop: dict,
           received: dict) -> int:
    """The training of `run`, in a folder it holds (`_OutLock`) and has checked (`_same_job`)."""
    from rla_ablate.errors import JobFailed, UserError
    from rla_ablate.outcome import Cause, Status
    from rla_ablate.train import ProgressLogger, run_job
    from rla_ablate.train.checkpoint import is_whole, list_checkpoints

    # The same record a sweep keeps beside each job: what ran, readable without the command line.
    (out / "job.json").write_text(job.model_dump_json(indent=1))
    if done:
        import warnings

        # the newest checkpoint that is whole; the trainer loads from it
        whole = [(t, path) for t, path in done if is_whole(path)]
        torn = [path.name for t, path in done if not whole or t > whole[-1][0]]
        if whole and whole[-1][0] >= job.train.total_tokens:
            console.print(f"already finished: {whole[-1][1]} ({whole[-1][0]:,} tokens); its results follow")
        elif whole:
            console.print(f"resuming from {whole[-1][1]} ({whole[-1][0]:,} tokens)"
                          + (f"; skipping the unreadable newer {', '.join(torn)}" if torn else ""))
        # said here; the trainer's warning would repeat it with a source line
        warnings.filterwarnings("ignore", message="skipped unreadable checkpoints")

    def on_signal(signum, frame):
        # Ctrl-C, and SIGTERM (a scheduler's preemption, `kill`, `timeout`): a checkpoint at the end of this step
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"], received["signal"] = True, signum
        again = "a second Ctrl-C" if signum == signal.SIGINT else "a second SIGTERM or Ctrl-C"
        console.print(f"{signal.Signals(signum).name}: stopping after this step (checkpoint); {again} stops at once, "
                      "without this step's checkpoint")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run_job(job, out, ProgressLogger(description=args.model, console=console),
                         should_stop=lambda: stop["requested"])
    except UserError as exc:
        # refused before training (data that cannot be read, too few tokens): a folder this command made goes,
        # unless a checkpoint is in it by now
        if made and not list_checkpoints(out):
            shutil.rmtree(out, ignore_errors=True)
        raise _in_model_file(exc, args) from None
    except KeyboardInterrupt:  # the second Ctrl-C: no checkpoint of the steps since the last one
        kept = [(t, path) for t, path in list_checkpoints(out) if is_whole(path)]
        then = (f"the same command resumes from {kept[-1][1]} ({kept[-1][0]:,} tokens)" if kept else
                "no checkpoint was written: the same command starts again from the first step")
        console.print(f"aborted without a checkpoint of this step; {then} (another configuration needs another "
                      "--out)")
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    _summary(console, result, out)
    resume = f"rerun the same command to resume from {out / 'checkpoints'}"
    if result.status == Status.FINISHED:
        return 0
    if result.status == Status.CANCELLED:
        console.print(f"cancelled at {result.tokens_done:,} tokens; {resume}")
        return 141 if stop["closed"] else 128 + received["signal"]
    if result.cause == Cause.CHECKPOINT:  # the user's to fix (move the files away): said as such, no traceback
        raise UserError((result.error or "no checkpoint loads").removeprefix("CheckpointError: "), key="--out")
    # A failure prints its whole traceback, which ends with the error line.
    raise JobFailed(f"job {result.status}: {result.traceback or result.error}\n{resume}"
                    if result.status == Status.FAILED else
                    f"job {result.status}: {result.error} (see loss_spike / skipped_step events in "
                    f"{out / 'metrics.jsonl'}); lower train.lr or raise train.max_skipped_steps, then {resume}")
