"""Score a job's checkpoint on lm-evaluation-harness tasks and record the accuracies with the job.

The checkpoint (`torch.load(weights_only=True)` through `rla_ablate.train.checkpoint`) is loaded into the HF
classes of `rla_ablate.models.hf` and wrapped in lm-eval's `HFLM`, with a Hugging Face tokenizer equal to the
job's data tokenizer (raw bytes: vocabulary 257, or the job's `tokenizers` JSON). Tasks are lm-eval's own names
and task YAML files found through a `TaskManager` with `include_path` (the shipped `tasks/` folder is always on
it). Results go to `JOB_DIR/evals/<tokens>-<key>.json` (key: tasks and limit) and to the job's MLflow run as
`eval/<task>/<metric>` at step = the checkpoint's tokens.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rla_ablate.errors import UserError, did_you_mean, exception_line

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
# lm-eval metric keys are "<metric>,<filter>"; MLflow names allow no comma, so "acc,none" -> "acc" and
# "exact_match,strict-match" -> "exact_match.strict-match".
_NO_FILTER = "none"


class EvalRequest(BaseModel):
    """What to score (`rla-sweep eval` and a sweep file's `evals:` section): lm-eval task names, where extra task YAML files live, and how many examples."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(min_length=1)
    """lm-eval task or group names (`piqa`, `arc_easy`) or names defined by YAML files on `include_path`."""
    include_path: list[Path] = Field(default_factory=list)
    """Folders of extra task YAML files (lm-eval's `--include_path`; in a sweep file relative to it); the shipped
    offline tasks are always added."""
    limit: int | None = Field(None, gt=0)
    """Examples per task (lm-eval's `--limit`); none = every example."""
    batch_size: int = Field(8, gt=0)
    """Requests per forward."""

    @field_validator("tasks")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        names = [t.strip() for t in v]
        if not names or not all(names):
            raise ValueError("give non-empty task names")
        twice = sorted({t for t in names if names.count(t) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once; give each task once")
        return names

    def key(self) -> str:
        """Hash of what decides the scores besides the checkpoint: the sorted tasks and the limit."""
        text = json.dumps({"tasks": sorted(self.tasks), "limit": self.limit}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]


class EvalResult(BaseModel):
    """The scores of one checkpoint on one request, as written to `evals/<tokens>-<key>.json`."""

    tasks: list[str]
    limit: int | None
    tokens: int
    """Tokens seen by the scored checkpoint: the MLflow step."""
    checkpoint: str
    metrics: dict[str, float]
    """`eval/<task>/<metric>` -> value (stderr left out)."""
    lm_eval_version: str = ""
    seconds: float = 0.0
    definitions: str = ""
    """Digest of the task files that defined the tasks (`task_files_digest`); empty in files written before it."""
    skipped: bool = False
    """True when the file already held these scores and nothing ran."""
    kept: dict[str, str] = {}
    """Metrics not logged to MLflow because a more complete scoring of the same checkpoint holds them there:
    metric -> that result's file name (not written to the file)."""
    notes: list[str] = []
    """What the command says of this scoring besides its scores (not written to the file)."""


# What a result file holds besides the scores themselves, and what it leaves out.
NOT_SAVED = {"skipped", "kept", "notes"}


def _more_complete(limit: int | None, than: int | None) -> bool:
    """Whether a scoring with `limit` examples per task (None: all) used more examples than one with `than`."""
    return than is not None and (limit is None or limit > than)


def kept_by_more_complete(job_dir: Path, result: EvalResult) -> dict[str, str]:
    """The metrics of `result` that another result file of the same checkpoint scored on more examples (a full
    scoring against a `--limit` check), with that file's name: the MLflow run keeps those, whichever ran last."""
    kept: dict[str, str] = {}
    for path in sorted((Path(job_dir) / "evals").glob(f"{int(result.tokens):015d}-*.json")):
        try:
            other = EvalResult.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if _more_complete(other.limit, result.limit):
            kept.update({k: path.name for k in result.metrics if k in other.metrics and k not in kept})
    # a task's count of examples stays with the scores it counts: kept with them, even where the more complete file
    # predates the count
    for key, name in list(kept.items()):
        count = examples_key(key)
        if count is not None and count in result.metrics:
            kept.setdefault(count, name)
    return kept


def log_results_again(job_dir: str | Path, tracking_uri: str, run_id: str) -> int:
    """Log every task score of the job's `evals/` folder to a run made again (a lost tracking store), as each
    scoring logged it: its metrics but those a more complete scoring of the same checkpoint holds. Returns the
    number of values logged."""
    logged = 0
    for path in sorted((Path(job_dir) / "evals").glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            result = EvalResult.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        kept = kept_by_more_complete(Path(job_dir), result)
        values = {k: v for k, v in result.metrics.items() if k not in kept}
        if values:
            log_to_mlflow(tracking_uri, run_id, values, result.tokens)
            logged += len(values)
    return logged


def unfinished_note(job_dir: Path, tokens: int, total: int, what: str) -> str:
    """What `eval` and `export` say of a job read at its last checkpoint before its training ended (`what`: "this
    scored", "it exported"): a search trial the pruner stopped ends there (its run is a result and is not trained
    further); any other job trains the rest when resumed."""
    from rla_ablate.outcome import Cause
    from rla_ablate.sweep.state import read_json

    status = read_json(job_dir / "status.json", {}) or {}
    if status.get("cause") == Cause.PRUNED.value:
        return (f"note: this job is a search trial that its pruner stopped at {tokens:,} of {total:,} tokens; {what} "
                "its last checkpoint, which is where the trial ends (a pruned trial is not trained further)")
    return (f"note: the job has not finished: {what} its last checkpoint, at {tokens:,} of {total:,} tokens; "
            "resume it to train the rest")


def result_path(job_dir: Path, tokens: int, req: EvalRequest) -> Path:
    return Path(job_dir) / "evals" / f"{int(tokens):015d}-{req.key()}.json"


def load_job(job_dir: str | Path, tokens: int | None = None, sweep_names: bool = True) -> tuple[Any, int, Path]:
    """(JobConfig, tokens, checkpoint path) of the job's final checkpoint, or of the one at `tokens`;
    `sweep_names`: whether the command also takes a sweep's name (its message then says so)."""
    from rla_ablate.train.checkpoint import is_whole, list_checkpoints
    from rla_ablate.train import JobConfig

    job_dir = Path(job_dir)
    spec = job_dir / "job.json"
    if not job_dir.exists():
        # `status` shows a job id's first 8 characters; its folder has all 12
        like = sorted(d for d in job_dir.parent.glob(f"{glob.escape(job_dir.name)}*") if (d / "job.json").is_file()) \
            if job_dir.parent.is_dir() and job_dir.name else []
        raise UserError(f"{job_dir} does not exist" + (f"; did you mean {like[0]}?" if len(like) == 1 else
                        f"; {len(like)} job folders start so: {', '.join(d.name for d in like)}" if like else ""),
                        key="JOB_DIR")
    if not spec.is_file() and (job_dir / "jobs.json").is_file() and sweep_names:
        from rla_ablate.fileio import shell_arg

        raise UserError(f"{job_dir} is a sweep's folder; give its name to score its finished jobs: `rla-sweep eval "
                        f"{job_dir.name} --root {shell_arg(job_dir.parent)} --tasks ...`", key="JOB_DIR")
    if not spec.is_file():
        raise UserError(f"{job_dir} is not a job folder (no job.json); give a folder written by `rla-sweep train "
                        "--out` or a sweep's jobs/<id>" + (", or a sweep name" if sweep_names else ""),
                        key="JOB_DIR")
    try:
        job = JobConfig.model_validate_json(spec.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{spec} is not a job config rla-sweep wrote ({first}); give the folder of a job written by "
                        "`rla-sweep train --out` or a sweep's jobs/<id>", key="JOB_DIR") from None
    found = list_checkpoints(job_dir)
    if not found:
        from rla_ablate.train.loggers import last_close, read_jsonl

        metrics = job_dir / "metrics.jsonl"
        closed = last_close(read_jsonl(metrics))
        if closed and closed.get("status") == "finished":
            # `train` keeps a finished record rather than train over it: "train the job first" would be refused
            again = "" if (job_dir / "status.json").is_file() else \
                f"; to train it again, move {metrics} away first (`rla-sweep train` keeps a finished record)"
            raise UserError(f"{job_dir} holds a finished run whose checkpoints are gone: there is no model to "
                            f"score{again}", key="JOB_DIR")
        raise UserError(f"no checkpoint in {job_dir / 'checkpoints'}: train the job first", key="JOB_DIR")
    if tokens is None:
        newest_tokens, newest = found[-1]
        if not is_whole(newest):
            older = ", ".join(str(t) for t, p in found[:-1] if is_whole(p))
            raise UserError(f"the newest checkpoint, {newest}, is unreadable (truncated or torn); "
                            + (f"give an older one with --checkpoint TOKENS ({older})" if older
                               else "no older checkpoint reads either: train or resume the job"),
                            key="JOB_DIR")
        return job, newest_tokens, newest
    for t, path in found:
        if t == tokens:
            return job, t, path
    raise UserError(f"no checkpoint at {tokens} tokens in {job_dir / 'checkpoints'}; allowed: "
                    + ", ".join(str(t) for t, _ in found), key="--checkpoint")


def hf_tokenizer(data_cfg: Any):
    """A `PreTrainedTokenizerFast` that encodes text exactly as the job's data did (ids, end-of-document id)."""
    from transformers import PreTrainedTokenizerFast

    from rla_ablate.data.tokenizer import JsonTokenizer, load_tokenizer

    kind = getattr(data_cfg, "kind", None)
    if kind == "mqar":
        raise UserError("the job trained on MQAR (synthetic token ids, no text): there is no tokenizer to score text "
                        "tasks with", key="JOB_DIR")
    if kind == "niah":
        # Needle-in-a-haystack text comes from its haystack config, with the haystack's tokenizer.
        data_cfg = data_cfg.haystack
        kind = getattr(data_cfg, "kind", None)
    source, eos = getattr(data_cfg, "tokenizer", None), getattr(data_cfg, "eos_token", None)
    if kind == "shards":
        # A shards folder records its tokenizer in index.json and keeps a copy (absent for bytes).
        from rla_ablate.data.shards import read_index

        meta = read_index(Path(data_cfg.path))
        if meta.get("tokenizer", "bytes") != "bytes":
            source, eos = Path(data_cfg.path) / meta["tokenizer"], meta.get("eos_token")
    tok = load_tokenizer(source, eos)
    if isinstance(tok, JsonTokenizer):
        fast = PreTrainedTokenizerFast(tokenizer_file=str(tok.path), eos_token=tok.eos_token)
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), eos_token="<|eos|>")
    # lm-eval pads batches; the end-of-document token is the only id the model knows beyond the text.
    fast.pad_token = fast.eos_token
    return fast


def byte_tokenizer():
    """A `tokenizers` Tokenizer with the ids of `ByteTokenizer`: byte b -> id b, `<|eos|>` -> 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    # ByteLevel spells every byte as one printable character; the vocabulary maps that character to the byte.
    alphabet = ByteLevel.alphabet()
    chars = _bytes_to_unicode()
    assert set(chars.values()) == set(alphabet)
    vocab = {chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|eos|>"])
    assert tok.token_to_id("<|eos|>") == 256
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer produces)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def load_weights(model: Any, checkpoint: Path) -> None:
    """The checkpoint's weights into `model` (the job's, from its job.json), or a UserError naming the file: one
    that does not load, or one written for another model."""
    from rla_ablate.train.checkpoint import load_checkpoint

    try:
        state = load_checkpoint(checkpoint)
    except Exception as exc:  # noqa: BLE001 - torch raises OSError, RuntimeError, pickle and zip errors here
        raise UserError(f"{checkpoint} does not load ({exception_line(exc)}); give another with "
                        "--checkpoint TOKENS", key="--checkpoint") from None
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0][:200]
        raise UserError(f"{checkpoint} does not hold the model of {checkpoint.parent.parent / 'job.json'} "
                        f"({first}): the folder mixes two jobs", key="JOB_DIR") from None


def build_lm(job: Any, checkpoint: Path, batch_size: int, device: str | None = None):
    """lm-eval's HFLM around the job's model at `checkpoint`, with the job's tokenizer and context length."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from rla_ablate.models.hf import RLASweepForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    hf = RLASweepForCausalLM.from_model_config(job.model)
    load_weights(hf.model, checkpoint)
    hf.to(device).eval()
    # As in training: bf16 autocast on CUDA (fp32 weights), fp32 on the CPU.
    autocast = torch.bfloat16 if str(device).startswith("cuda") else None
    return HFLM(pretrained=hf, tokenizer=hf_tokenizer(job.data), batch_size=batch_size,
                max_length=int(job.train.seq_len), backend="causal", add_bos_token=False,
                mixed_precision_dtype=autocast)


@contextlib.contextmanager
def offline(enabled: bool = True):
    """No network for datasets and the hub while loading local task files (env and the already-read configs)."""
    if not enabled:
        yield
        return
    names = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    saved_env = {k: os.environ.get(k) for k in names}
    os.environ.update({k: "1" for k in names})
    patched = []
    for module, attr in (("datasets.config", "HF_DATASETS_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        try:
            mod = __import__(module, fromlist=["_"])
        except ImportError:
            continue
        if hasattr(mod, attr):
            patched.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, True)
    try:
        yield
    finally:
        for mod, attr, value in patched:
            setattr(mod, attr, value)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def quiet(enabled: bool = True):
    """No progress bars and no lm-eval warnings (a launch's own progress lines stay readable)."""
    if not enabled:
        yield
        return
    import logging

    import io

    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        # lm-eval's progress bars (tqdm) write to sys.stderr; exceptions still propagate.
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class _DropKnown:
    """A logging filter that drops the records whose message contains one of `parts`."""

    def __init__(self, *parts: str):
        self.parts = parts

    def filter(self, record) -> bool:
        return not any(part in record.getMessage() for part in self.parts)


@contextlib.contextmanager
def lm_eval_quirks():
    """Two things lm-eval does that say nothing about a job's scores: it asks git for the working folder's commit
    (`fatal: not a git repository` on the terminal outside one, once per job) and warns, twice, that the model it is
    given is an instance, not a name (as rla-sweep always gives it)."""
    import logging

    import lm_eval.evaluator as evaluator

    probe = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = lambda: None
    drop = _DropKnown("`pretrained` model kwarg is not of type `str`",
                      "Passed an already-initialized model through `pretrained`")
    logger = logging.getLogger("lm_eval.models.huggingface")
    logger.addFilter(drop)
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = probe
        logger.removeFilter(drop)


def _local_config(entry: Any) -> dict | None:
    """A task's config with its local `data_files` resolved next to its YAML file; None if it reads the hub."""
    import yaml

    path = getattr(entry, "yaml_path", None)
    cfg = getattr(entry, "cfg", None)
    if path is None or not isinstance(cfg, dict):
        return None
    path = Path(path)
    cfg = copy.deepcopy(cfg)
    if "include" in cfg:
        base = yaml.safe_load((path.parent / cfg.pop("include")).read_text(encoding="utf-8")) or {}
        cfg = {**base, **cfg}
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if cfg.get("dataset_path") not in ("json", "csv", "text", "parquet", "arrow") or not files:
        return None

    def fix(p: str) -> str:
        q = Path(p)
        return str(q if q.is_absolute() else (path.parent / q).resolve())

    if isinstance(files, str):
        files = fix(files)
    elif isinstance(files, list):
        files = [fix(f) for f in files]
    else:
        files = {split: (fix(f) if isinstance(f, str) else [fix(x) for x in f]) for split, f in files.items()}
    cfg["dataset_kwargs"] = {**cfg["dataset_kwargs"], "data_files": files}
    return cfg


def check_include_path(req: EvalRequest) -> None:
    """Every --include-path folder exists (checked before a cached result is read, so that a wrong folder is said
    whether or not the job was scored already)."""
    for p in req.include_path:
        if not Path(p).is_dir():
            raise UserError(f"{p} is a file, not a folder of task YAML files" if Path(p).exists()
                            else f"no such folder: {p}", key="--include-path")


def unreadable_task_files(folders: list[str]) -> list[str]:
    """'file:line: problem' for each YAML file under the task folders that does not parse: lm-eval skips such a
    file, so its task is then only "unknown". Its tags (`!function`) are read as nothing."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    out = []
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 - a SafeLoader
            except UnicodeDecodeError:
                out.append(f"{path}: not UTF-8 text")
            except OSError as exc:
                out.append(f"{path}: unreadable ({exc.strerror or exc})")
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
                out.append(f"{where}: {getattr(exc, 'problem', None) or exc}")
    return out


def check_names_apart(eval_names: list[str], req: EvalRequest) -> str | None:
    """The first task named as one of the job's eval sets, or None: both would log `eval/<name>/...` into one run,
    and the later would overwrite the earlier's values of a shared metric (acc)."""
    names = set(eval_names)
    return next((t for t in req.tasks if t in names), None)


def require_lm_eval() -> None:
    """lm-eval is one of the package's dependencies: an environment without it (a partial install, a node's
    hand-made site folder) is told what to install, instead of an import traceback."""
    import importlib.util
    import sys

    if importlib.util.find_spec("lm_eval") is not None:
        return
    from importlib.metadata import PackageNotFoundError, requires

    try:
        pinned = next((r.split(";")[0].strip() for r in requires("rla-sweep") or () if r.startswith("lm-eval")),
                      "lm-eval[hf]")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        pinned = "lm-eval[hf]"
    raise UserError(f"scoring tasks needs lm-evaluation-harness, which this Python ({sys.executable}) does not "
                    f"have: `{sys.executable} -m pip install '{pinned}'` (the version rla-sweep pins)", key="--tasks")


def resolve_tasks(req: EvalRequest) -> tuple[Any, list[Any], bool]:
    """(TaskManager, tasks for simple_evaluate, all local): local-file tasks as configs with absolute paths."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    check_include_path(req)
    paths = [str(TASKS_DIR)] + [str(Path(p).resolve()) for p in req.include_path]
    # Indexing lm-eval's own tasks takes half a minute: only when a name is not in the include path.
    tm = TaskManager(include_path=paths, include_defaults=False)
    if any(t not in tm.all_tasks for t in req.tasks):
        tm = TaskManager(include_path=paths, include_defaults=True)
    unknown = [t for t in req.tasks if t not in tm.all_tasks]
    if unknown:
        hints = []
        for t in unknown:
            hints.append(f"{t!r}{did_you_mean(t, tm.all_tasks, n=3)}")
        shipped = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
        broken = unreadable_task_files(paths[1:])
        raise UserError(f"unknown task(s) {', '.join(hints)}; allowed: lm-eval's task names (`lm-eval ls tasks` lists "
                        f"them), tasks defined in --include-path folders, and the shipped {', '.join(shipped)}"
                        + (f"; these task files do not parse, so lm-eval skipped them: {'; '.join(broken)}"
                           if broken else ""), key="--tasks")
    index = getattr(tm, "task_index", {})
    tasks: list[Any] = []
    local = True
    for name in req.tasks:
        cfg = _local_config(index.get(name))
        local = local and cfg is not None
        tasks.append(cfg if cfg is not None else name)
    return tm, tasks, local


EXAMPLES = "examples"
"""`eval/<task>/examples`: how many of the task's examples a scoring used (`--limit` takes the first ones). Scores
on different counts are not comparable; the dashboard says so where it compares them."""


def examples_key(key: str) -> str | None:
    """The examples count of the task a score `eval/<task>/<metric>` belongs to, or None for another key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "eval" or parts[2] == EXAMPLES:
        return None
    return f"eval/{parts[1]}/{EXAMPLES}"


def flatten_results(results: dict) -> dict[str, float]:
    """lm-eval's results -> {eval/<task>/<metric>: value} and each scored task's `eval/<task>/examples`; stderr
    entries and non-numbers left out."""
    out: dict[str, float] = {}
    counts = results.get("n-samples") or {}
    for task, metrics in (results.get("results") or {}).items():
        scored = False
        for key, value in metrics.items():
            if key in ("alias", "sample_len") or "_stderr" in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, _, filt = key.partition(",")
            name = metric if filt in ("", _NO_FILTER) else f"{metric}.{filt}"
            out[f"eval/{task}/{name}"] = float(value)
            scored = True
        n = (counts.get(task) or {}).get("effective", metrics.get("sample_len"))
        if scored and isinstance(n, int) and not isinstance(n, bool):
            out[f"eval/{task}/{EXAMPLES}"] = float(n)
    return out


def unscored_tasks(results: dict, metrics: dict[str, float], tasks: list[str]) -> list[str]:
    """The requested tasks (or groups, through their subtasks) for which lm-eval's `results` (flattened: `metrics`)
    hold no score: a metric its YAML names that lm-eval does not know is warned about and left out, and the task has
    nothing to save."""
    groups = results.get("group_subtasks") or {}

    def scored(name: str, depth: int = 0) -> bool:
        return any(k.startswith(f"eval/{name}/") and not k.endswith(f"/{EXAMPLES}") for k in metrics) or (
            depth < 8 and any(scored(sub, depth + 1) for sub in groups.get(name, [])))

    return [t for t in tasks if not scored(t)]


def task_files_digest(req: EvalRequest) -> str:
    """SHA-256 (first 16 hex digits) of the files that define the request's local tasks: the shipped task folder and
    every --include-path folder, each file's path within its folder and its bytes. A result file scored under other
    definitions (a task file or its data edited, another folder with a task of the same name) is scored again."""
    digest = hashlib.sha256()
    for folder in [TASKS_DIR, *(Path(p).resolve() for p in req.include_path)]:
        digest.update(b"\0folder\0")
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            try:
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            except OSError:
                digest.update(b"unreadable")
    return digest.hexdigest()[:16]


def tracking_target(job_dir: Path) -> tuple[str | None, str | None]:
    """(tracking URI, run id) of the job: its status.json's run in its sweep's store (the SQLite file when the
    embedded server is gone), (None, None) for a job trained outside a sweep, (None, run id) for a sweep's job
    folder that is no longer in its sweep's folder."""
    from rla_ablate.sweep.state import read_json
    from rla_ablate.tracking import is_healthy

    status = read_json(job_dir / "status.json", {}) or {}
    run_id = status.get("mlflow_run_id")
    if not run_id:
        return None, None
    sweep = job_dir.parent.parent
    if job_dir.parent.name != "jobs" or not (sweep / "sweep.json").is_file():
        # a sweep's job folder copied or moved out of its sweep: its run is in a store this folder is not beside
        return None, run_id
    meta = read_json(sweep / "sweep.json", {}) or {}
    if meta.get("embedded_tracking", True):
        # the sweep folder's own store, through the server a launch runs on it if there is one: never the address
        # recorded where the folder was made (a copied folder would log into the original's runs)
        from rla_ablate.sweep.state import SweepDir
        from rla_ablate.tracking import TrackingServer

        return TrackingServer(SweepDir(sweep.parent, sweep.name).mlflow_dir).reading_uri(), run_id
    uri = status.get("tracking_uri") or meta.get("tracking_uri")
    if uri and uri.startswith("http") and not is_healthy(uri):
        uri = meta.get("backend_uri") or None
    return uri, run_id


def log_to_mlflow(uri: str, run_id: str, metrics: dict[str, float], step: int) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, int(step)) for k, v in sorted(metrics.items())]
    client = MlflowClient(uri)
    for i in range(0, len(batch), 100):
        client.log_batch(run_id, metrics=batch[i:i + 100])


def score_job(job_dir: str | Path, req: EvalRequest, *, tokens: int | None = None, tracking_uri: str | None = None,
              run_id: str | None = None, force: bool = False, device: str | None = None,
              silent: bool = False) -> EvalResult:
    """Score the job's final (or `tokens`) checkpoint on `req`, unless its result file exists (then it is read).

    Results go to the job's `evals/` folder and, when the job has a run (`tracking_uri` and `run_id`, else
    the ones in its status.json / sweep.json), to MLflow as `eval/<task>/<metric>` at step = tokens.
    """
    job_dir = Path(job_dir)
    check_include_path(req)
    job, tokens, ckpt = load_job(job_dir, tokens)
    clash = check_names_apart([e.name for e in job.eval], req)
    if clash is not None:
        raise UserError(f"task '{clash}' has the name of one of the job's eval sets: both would log "
                        f"eval/{clash}/* into its run, one over the other; score the task under another name (a copy "
                        "of its YAML in an --include-path folder with another `task:`)", key="--tasks")
    path = result_path(job_dir, tokens, req)
    definitions = task_files_digest(req)
    notes: list[str] = []
    if path.is_file() and not force:
        done = EvalResult.model_validate_json(path.read_text(encoding="utf-8"))
        if not done.definitions or done.definitions == definitions:
            return done.model_copy(update={"skipped": True})
        notes.append(f"note: the task files (shipped or in --include-path) differ from those {path.name} was scored "
                     "with: scored again, and the file replaced")
    t0 = time.monotonic()
    tm, tasks, local = resolve_tasks(req)
    import lm_eval

    with offline(local), quiet(silent), lm_eval_quirks():
        lm = build_lm(job, ckpt, req.batch_size, device)
        try:
            results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=req.limit,
                                              batch_size=req.batch_size, bootstrap_iters=0, log_samples=False,
                                              random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                              fewshot_random_seed=0)
        except FileNotFoundError as exc:  # a task file whose data file is not where it says
            raise UserError(f"a task's data could not be read: {exc}", key="--tasks") from None
        except (BrokenPipeError, ConnectionResetError):  # a closed pipe (`| head`), not the Hub
            raise
        except ConnectionError as exc:  # lm-eval's own tasks load their data from the Hub or its cache
            raise UserError(f"a task's data is not in this machine's Hugging Face cache and the Hub cannot be "
                            f"reached: {exception_line(exc, 300)}; fetch it once where the Hub is reachable "
                            "(the same HF_HOME), or score the shipped tasks, which need no download",
                            key="--tasks") from None
    metrics = flatten_results(results)
    unscored = unscored_tasks(results, metrics, req.tasks)
    if unscored:  # nothing is saved: a result file without its scores would be read back as "already scored"
        raise UserError(f"lm-eval returned no score for task(s) {', '.join(unscored)}: a metric a task's YAML names "
                        "(metric_list) is not one lm-eval knows, or the task has no examples; lm-eval's warnings "
                        "above say which. Nothing was saved", key="--tasks")
    result = EvalResult(tasks=req.tasks, limit=req.limit, tokens=tokens, checkpoint=ckpt.name,
                        metrics=metrics, lm_eval_version=getattr(lm_eval, "__version__", ""),
                        seconds=round(time.monotonic() - t0, 2), definitions=definitions, notes=notes)
    if tracking_uri is None or run_id is None:
        tracking_uri, run_id = tracking_target(job_dir)
        if run_id and not tracking_uri:
            result.notes.append(f"note: {job_dir} is not in its sweep's folder (copied or moved: no sweep.json two "
                                f"levels up), so its MLflow run {run_id[:8]} was not updated; the scores are in "
                                f"{path.parent}")
    # The run's value of a metric at this step is the most complete scoring of it, not the last request: a
    # `--limit` check after the full scoring must not replace the full scores in results and dashboards.
    result.kept = kept_by_more_complete(job_dir, result) if tracking_uri and run_id else {}  # no run, nothing kept
    logged = {k: v for k, v in result.metrics.items() if k not in result.kept}
    from rla_ablate.fileio import atomic_write_text

    # the file first: a run that cannot be logged to loses no scores (`log_results_again` logs them later)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, result.model_dump_json(indent=1, exclude=NOT_SAVED))
    if tracking_uri and run_id and logged:
        from mlflow.exceptions import MlflowException

        try:
            log_to_mlflow(tracking_uri, run_id, logged, tokens)
        except MlflowException as exc:
            result.notes.append(f"note: the scores could not be logged to MLflow run {run_id[:8]} "
                                f"({exception_line(exc, 160)}); they are in {path}")
    return result


def score_sweep(root: str | Path, sweep: str, req: EvalRequest, *, tracking_uri: str | None = None,
                force: bool = False, device: str | None = None, echo=lambda line: None,
                silent: bool = False) -> dict[str, EvalResult]:
    """Score every finished job of the sweep's current expansion, one after another in this process (on this
    machine's GPU when it has one); jobs already scored on `req` are read back, not rescored."""
    from rla_ablate.outcome import Status
    from rla_ablate.sweep.progress import fmt_duration
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, sweep)
    if not sdir.has_job_list():
        raise UserError(f"no sweep {sweep!r} under {sdir.root} (no jobs.json) and no job folder of that name; give "
                        "a job folder, or a sweep name with --root", key="JOB_DIR|SWEEP")
    results: dict[str, EvalResult] = {}
    jobs = sdir.job_list()
    states = [sdir.status(rec["job_id"]) for rec in jobs]  # read once: scoring changes none of them
    spent: list[float] = []  # seconds of each job scored here (a result read back costs nothing)
    for k, (rec, st) in enumerate(zip(jobs, states), 1):
        job_id, name = rec["job_id"], rec.get("name", rec["job_id"])
        if st.status != Status.FINISHED:
            echo(f"[{k}/{len(jobs)}] {name}: {st.status.value}, not scored")
            continue
        uri = tracking_uri if tracking_uri and st.mlflow_run_id else None
        result = score_job(sdir.job_dir(job_id), req, tracking_uri=uri, run_id=st.mlflow_run_id if uri else None,
                           force=force, device=device, silent=silent)
        results[job_id] = result
        if result.skipped:
            echo(f"[{k}/{len(jobs)}] {name}: already scored")
            continue
        spent.append(result.seconds)
        left = sum(1 for later in states[k:] if later.status == Status.FINISHED)
        eta = f", about {fmt_duration(left * sum(spent) / len(spent))} left for {left} more" if left else ""
        echo(f"[{k}/{len(jobs)}] {name}: scored in {result.seconds:.1f} s{eta}")
    return results

