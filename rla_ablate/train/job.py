"""`JobConfig`: everything that defines one training job, and `JobResult` (= `rla_ablate.outcome.JobOutcome`),
what running it returns.

The canonical JSON of a resolved `JobConfig` (sorted keys, no whitespace) is what the sweep hashes into a
job id, and what a checkpoint records so that a resume never continues a different configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rla_ablate.config.dotted import flat_dotted
from rla_ablate.data.config import RECALL_KINDS, DataConfig, EvalConfig, StdlibData
from rla_ablate.models.config import ModelConfig
from rla_ablate.outcome import JobOutcome
from rla_ablate.train.config import TrainConfig

# Fields that change how a job is observed or stored, never the numbers it computes: a resume may change them.
BOOKKEEPING_FIELDS = frozenset(
    {"keep_checkpoints", "checkpoint_every_tokens", "log_every_tokens", "eval_every_tokens", "stats_every_tokens",
     "peak_flops", "cuda_graphs"}
)


DEFAULT_EVAL = ({"name": "val", "data": {"kind": "stdlib", "split": "validation"}},)


def _default_eval() -> list[EvalConfig]:
    return [EvalConfig.model_validate(e) for e in DEFAULT_EVAL]


# What Trainer logs (rla_ablate.train.loop: _flush_window and evaluate); tests/test_train_loop.py holds it to that.
TRAIN_METRICS = ("train/loss", "train/grad_norm", "train/lr", "train/skipped_steps", "train/tokens_per_s", "train/mfu",
                 "train/peak_mem_gib")
EVAL_METRICS = ("loss", "ppl", "acc", "acc_area")
GPU_METRICS = ("train/mfu", "train/peak_mem_gib")  # logged by jobs that train on a GPU only


def better_direction(metric: str) -> str | None:
    """Which way a logged metric gets better, as a search's direction says it: "maximize" for an accuracy (and the
    area under its curve) and the training speed, "minimize" for a loss and perplexity, None for the others (the
    learning rate, the gradient norm: no better side)."""
    last = metric.rsplit("/", 1)[-1].removesuffix("_area")
    if last in ("acc", "accuracy", "acc_norm") or metric in ("train/tokens_per_s", "train/mfu"):
        return "maximize"
    return "minimize" if last in ("loss", "ppl") else None


def training_overlap(train, held_out) -> str:
    """Why the eval data `held_out` shares documents with the training data `train` (and what to change), or "" where
    they are apart. Text folders split their files by a hash of the path: train (at validation_fraction f) and
    validation (at f') share no file when f' <= f; "all" shares every file; a file of a folder is in the folder's
    split its path hashes into. Shards have no split; a saved dataset's split is its own; shards that `data
    prepare` made hold every file of a text folder, or the split of the embedded corpus their index records.
    Synthetic tasks and other sources never overlap here."""
    if train.kind == "shards" and held_out.kind in ("text", "jsonl", "stdlib"):
        return _shards_overlap(train, held_out)
    if train.kind != held_out.kind or train.kind not in ("stdlib", "text", "jsonl", "shards", "hf_disk"):
        return ""
    if train.kind == "stdlib":
        if train.split != held_out.split:
            return ""
        fix = "data.split: train" if train.split == "validation" else "an eval set on split: validation"
        return f"both read the embedded corpus' {train.split} split; train on split: train ({fix})"
    if train.kind in ("text", "jsonl") and train.path != held_out.path:
        return _file_in_folder(train, held_out)
    if train.path != held_out.path:
        return ""
    if train.kind == "shards":
        return f"both read the shards {train.path} (shards have no split); evaluate on other shards"
    if train.kind == "hf_disk":
        return (f"both read split {train.split or '(its only or train)'} of {train.path}; an eval set reads another "
                "split" if train.split == held_out.split else "")
    if train.glob != held_out.glob and train.path.is_dir():
        return ""
    if train.path.is_file():
        return (f"both read {train.path}, one file, which falls whole in one split (files are split by their path); "
                "evaluate on another file, or split the text into a folder of files")
    splits = {train.split, held_out.split}
    if splits == {"train", "validation"}:
        val, trains = (held_out, train) if held_out.split == "validation" else (train, held_out)
        if val.validation_fraction <= trains.validation_fraction:
            return ""
        return (f"the validation split reads validation_fraction {val.validation_fraction} of {train.path} and the "
                f"train split {trains.validation_fraction}: the files between the two hash into both; give both the "
                f"same validation_fraction (data.validation_fraction: {val.validation_fraction})")
    if "all" in splits:
        fraction = held_out.validation_fraction if held_out.split == "validation" else train.validation_fraction
        return (f"the training data reads split {train.split} of {train.path} and the eval set split "
                f"{held_out.split}; train on split: train and evaluate on split: validation at one validation_fraction "
                f"(data.split: train, data.validation_fraction: {fraction})")
    return f"both read split {train.split} of {train.path}; an eval set reads split: validation"


def _file_in_folder(train, held_out) -> str:
    """Where one side reads a single file of the other's folder: the overlap when that file falls in the folder
    side's split (`training_overlap`)."""
    from rla_ablate.data.sources import path_fraction

    for one, folder in ((train, held_out), (held_out, train)):
        if one.path.is_file() and folder.path.is_dir() and folder.path in one.path.parents:
            name = one.path.relative_to(folder.path).as_posix()
            side = "validation" if path_fraction(name) < folder.validation_fraction else "train"
            if folder.split in ("all", side):
                return (f"{one.path} lies in {folder.path} and falls in its {side} split, which the "
                        f"{'eval set' if folder is held_out else 'training data'} reads; train and evaluate on files "
                        "apart")
    return ""


def _shards_overlap(train, held_out) -> str:
    """Shards trained on against text or the embedded corpus evaluated on: what their index says they were made from
    (`training_overlap`)."""
    from rla_ablate.data.shards import read_index

    index = read_index(train.path)
    source = index.get("source")
    if held_out.kind == "stdlib":
        if source == "stdlib" and index.get("source_split") == held_out.split:
            return (f"the shards {train.path} were prepared from the embedded corpus' {held_out.split} split, which "
                    "the eval set reads; prepare them from its train split (`rla-sweep data prepare stdlib OUT "
                    "--split train`)")
        return ""
    made_from = Path(source) if source and source != "stdlib" else None
    if made_from is not None and (made_from == held_out.path or made_from in held_out.path.parents
                                  or held_out.path in made_from.parents):
        return (f"the shards {train.path} were prepared from {made_from}, every file of it, and the eval set "
                f"reads {held_out.path}; prepare the shards from the files that train alone, or evaluate on "
                "text they were not made from")
    return ""


class JobConfig(BaseModel):
    """One model trained on one data stream for one token budget, evaluated on a list of eval sets."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig
    """The model (a preset's ModelConfig, possibly with overrides)."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Optimizer, schedule, budget, precision, logging, checkpoints and workers."""
    data: DataConfig = Field(default_factory=StdlibData)
    """The training data (default: the embedded corpus, byte tokens)."""
    eval: list[EvalConfig] = Field(default_factory=_default_eval)
    """Evaluation sets (default: the embedded corpus' validation split); names must be unique."""

    @field_validator("eval")
    @classmethod
    def _unique_names(cls, evals: list[EvalConfig]) -> list[EvalConfig]:
        names = [e.name for e in evals]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # at the eval list's line (a check of the whole job had the job's line and its name twice)
            raise ValueError(f"names must be unique; repeated: {', '.join(repeated)}")
        return evals

    @field_validator("eval")
    @classmethod
    def _whole_windows(cls, evals: list[EvalConfig], info: ValidationInfo) -> list[EvalConfig]:
        train = info.data.get("train")
        seq_len = train.seq_len if train is not None else None
        for i, e in enumerate(evals):  # a text set scores whole windows: fewer tokens would score one anyway
            if seq_len is not None and e.data.kind not in RECALL_KINDS and e.tokens < seq_len:
                raise ValueError(f"set {i} ('{e.name}'): tokens {e.tokens} is under one window of train.seq_len "
                                 f"({seq_len}); an eval set scores whole windows: use at least {seq_len}")
        return evals

    @model_validator(mode="after")
    def _check(self) -> "JobConfig":
        own = getattr(self.data, "seq_len", None) or getattr(self.data, "context_length", None)
        if own is not None and own != self.train.seq_len:
            field = "seq_len" if self.data.kind == "mqar" else "context_length"
            raise ValueError(f"data.{field} ({own}) must equal train.seq_len ({self.train.seq_len}) or be unset: "
                             "batch_tokens counts train.seq_len tokens per training sequence")
        for i, e in enumerate(self.eval):
            shared = training_overlap(self.data, e.data)
            if shared:  # its loss would be a training loss, under an eval set's name
                raise ValueError(f"eval set {i} ('{e.name}') reads text the model trains on: {shared}")
        return self

    def logged_metrics(self, on_gpu: bool = True) -> list[str]:
        """The step-indexed metrics the trainer logs for this job (metrics.jsonl and MLflow), the ones a search can
        optimize: `train/*` every log interval (GPU_METRICS only `on_gpu`) and, per eval set,
        `eval/<name>/{loss,ppl,acc,acc_area}` at each evaluation. Layer stats and diagnostics are not in this list."""
        train = [m for m in TRAIN_METRICS if on_gpu or m not in GPU_METRICS]
        return [*train, *(f"eval/{e.name}/{m}" for e in self.eval for m in EVAL_METRICS)]

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, ASCII: equal configs give equal strings on every machine."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)

    def identity_json(self) -> str:
        """The canonical JSON without bookkeeping fields: what a checkpoint must match to be resumed."""
        data = self.model_dump(mode="json")
        for key in BOOKKEEPING_FIELDS:
            data["train"].pop(key, None)
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def identity_differences(mine: str, theirs: str, most: int = 4) -> str:
    """Where two identity JSONs (`JobConfig.identity_json`) differ, in words: "train.tokens (8192 now, 4096
    before), ..." (the first `most` dotted keys); a list of sections whose length differs as its entries' count,
    "eval (1 entry now, none before)", not each key of the entries one side lacks."""
    shown = [f"{k} ({now} now, {before} before)" for k, now, before in _differing(json.loads(mine), json.loads(theirs))]
    return ", ".join(shown[:most]) + (f" and {len(shown) - most} more" if len(shown) > most else "")


def _differing(a, b, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, now, before) where two JSON trees differ, in sorted key order (`identity_differences`)."""
    def sections(x) -> bool:
        return isinstance(x, list) and any(isinstance(v, (dict, list)) for v in x)

    if isinstance(a, list) and isinstance(b, list) and (sections(a) or sections(b)) and len(a) != len(b):
        entries = lambda n: f"{n} entr{'y' if n == 1 else 'ies'}" if n else "none"  # noqa: E731
        return [(prefix[:-1], entries(len(a)), entries(len(b)))]
    flat_a = flat_dotted(a, prefix)
    if not isinstance(a, (dict, list)) or type(a) is not type(b) or flat_a.keys() == {prefix[:-1]}:
        return [] if a == b else [(prefix[:-1], json.dumps(a), json.dumps(b))]
    out = []
    for key in sorted(set(a) | set(b)) if isinstance(a, dict) and isinstance(b, dict) else range(len(a)):
        if isinstance(key, int) or (key in a and key in b):
            out += _differing(a[key], b[key], f"{prefix}{key}.")
        else:  # a key one side lacks: each of its leaves, as before
            side = flat_dotted(a[key] if key in a else b[key], f"{prefix}{key}.")
            out += [(k, json.dumps(v) if key in a else '"(unset)"', json.dumps(v) if key in b else '"(unset)"')
                    for k, v in side.items()]
    return out


def another_job(mine: str, theirs: str) -> str:
    """The refusal's words for checkpoints of another job: which keys differ, and what to do."""
    return (f"a different job configuration: {identity_differences(mine, theirs)}; use a new --out folder or the "
            "original configuration")


# What `run_job` returns is the one job outcome type of the package (rla_ablate.outcome): status, tokens,
# metrics, error line, traceback and cause. The old name stays for callers of the train API.
JobResult = JobOutcome
