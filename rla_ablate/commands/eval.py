"""`rla-sweep eval JOB_DIR|SWEEP --tasks T1,T2`: downstream accuracy of a job (or every finished job of a sweep)
on lm-evaluation-harness tasks; results in JOB_DIR/evals/ and the job's MLflow run (`eval/<task>/<metric>`)."""

from __future__ import annotations

from rla_ablate.environment import add_root_option

from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="score a job's checkpoint (or a sweep's finished jobs) on lm-eval tasks",
        description="Score the final (or --checkpoint) checkpoint of a job folder, or of every finished job of a "
                    "sweep, on lm-evaluation-harness tasks. Scores go to JOB_DIR/evals/<tokens>-<key>.json and "
                    "to the job's MLflow run as eval/<task>/<metric> at step = tokens; a request already scored "
                    "is not scored again (--force does). Sweep jobs run one after another on this machine's GPU "
                    "(or CPU).")
    parser.add_argument("target", metavar="JOB_DIR|SWEEP", help="a job folder (job.json, checkpoints/) or a sweep name")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, e.g. piqa,arc_easy or the "
                                                       "shipped offline rla_choice,rla_complete")
    parser.add_argument("--include-path", action="append", default=[], metavar="DIR",
                        help="a folder of extra task YAML files (lm-eval's include_path; repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per forward (default 8)")
    add_root_option(parser, "the launch's --root, for a sweep name")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="TOKENS",
                        help="score the checkpoint at this many tokens instead of the final one (job folders only)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when available)")
    parser.add_argument("--force", action="store_true", help="score again even when the result file exists")
    parser.set_defaults(func=run)


def _check_device(text: str) -> None:
    """A UserError (exit 2) for a --device this process cannot score on: not cpu / cuda / cuda:N, CUDA absent, or
    a GPU index past the last one (torch asserted or raised from deep inside the model's build)."""
    import torch

    from rla_ablate.errors import UserError

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"'{text}' is not a device here; allowed: cpu, cuda, cuda:N", key="--device")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{text} asked for but CUDA is not available here; allowed here: cpu", key="--device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"{text}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                            f"cuda:{torch.cuda.device_count() - 1}", key="--device")


def run(args) -> int:
    from pydantic import ValidationError

    from rla_ablate.errors import UserError
    from rla_ablate.evals.core import EvalRequest, score_job, score_sweep

    try:
        # "a,b," on a command line means a and b
        tasks = [t for t in args.tasks.split(",") if t.strip()]
        if not tasks:
            raise UserError(f"names no task (got {args.tasks!r}); give lm-eval task names separated by commas, e.g. "
                            "piqa,arc_easy or the shipped rla_choice,rla_complete", key="--tasks")
        req = EvalRequest(tasks=tasks, include_path=args.include_path, limit=args.limit,
                          batch_size=args.batch_size)
    except ValidationError as exc:
        err = exc.errors()[0]
        # pydantic's own constraint messages say what is allowed, not what was given; the project's validators do
        own = err["msg"].startswith("Value error, ")
        got = f" (got {err['input']!r})" if "input" in err and not own and not isinstance(err["input"], dict) else ""
        raise UserError(err["msg"].removeprefix("Value error, ") + got,
                        key="--" + str(err["loc"][0]).replace("_", "-")) from None
    if args.device is not None:
        _check_device(args.device)
    from rla_ablate.sweep.state import SweepDir

    if args.target.endswith((".yaml", ".yml")) and Path(args.target).is_file():
        from rla_ablate.sweep.status import note_other_file, resolve_name

        note_other_file(args.root, args.target)  # a file other than the launched one: its jobs are not these
        args.target = resolve_name(args.target)  # a sweep file names its sweep, as for status and results
    target = Path(args.target)
    if "/" not in args.target and not target.exists():  # a sweep's name: under --root
        from rla_ablate.sweep.status import check_root_folder

        check_root_folder(args.root)
    is_sweep = "/" not in args.target and SweepDir(args.root, args.target).has_job_list()
    # a path (it has a folder in it) that does not exist is a job folder mistyped, not a sweep's name
    if (target / "job.json").is_file() or (target.is_dir() and not is_sweep) or ("/" in args.target
                                                                              and not target.exists()):
        result = score_job(target, req, tokens=args.checkpoint, force=args.force, device=args.device)
        _print(str(target), result)
        _note_unfinished(target, result, args.checkpoint)
        return 0
    if args.checkpoint is not None:
        raise UserError("--checkpoint applies to a job folder; a sweep scores each job's final checkpoint",
                        key="--checkpoint")
    import sys

    # a line per job with the time left, instead of lm-eval's progress bars (several per job and task)
    results = score_sweep(args.root, args.target, req, force=args.force, device=args.device,
                          echo=lambda line: print(line, file=sys.stderr, flush=True), silent=True)
    from rla_ablate.outcome import Cause

    sdir = SweepDir(args.root, args.target)
    names = {rec["job_id"]: rec.get("name", rec["job_id"]) for rec in sdir.job_list()}
    for job_id, result in results.items():
        _print(f"{names.get(job_id, job_id)} ({job_id[:8]})", result)
    # a line to end on: how many jobs have scores now, and why the others have none (exit 1 when none has); a
    # search's pruned trials stay unfinished, and a resume does not train them
    unscored = [j for j in names if j not in results]
    pruned = sum(sdir.status(j).cause == Cause.PRUNED for j in unscored)
    read_back = sum(r.skipped for r in results.values())
    line = (f"eval {args.target}: {len(results)} of {len(names)} jobs scored"
            + (f" ({read_back} already)" if read_back else "")
            + (f"; {pruned} pruned by Optuna, not scored" if pruned else "")
            + (f"; {len(unscored) - pruned} not finished, not scored: `rla-sweep resume {args.target} --root "
               f"{sdir.root}` trains them, then eval again" if len(unscored) > pruned else ""))
    print(line, file=sys.stderr)
    return 0 if results else 1


def _print(where: str, result) -> None:
    import sys

    state = "already scored" if result.skipped else f"scored in {result.seconds:.1f} s"
    print(f"{where}: {result.checkpoint} ({result.tokens} tokens), {state}")
    for key, value in sorted(result.metrics.items()):
        print(f"  {key} = {int(value) if key.endswith('/examples') else f'{value:.4f}'}")
    for note in result.notes:
        print(note, file=sys.stderr)
    if result.kept and not result.skipped:
        files = ", ".join(sorted(set(result.kept.values())))
        print(f"note: {len(result.kept)} of these scores are not the MLflow run's: it keeps those of {files}, which "
              f"scored the same checkpoint on more examples (--limit {result.limit} here)", file=sys.stderr)


def _note_unfinished(job_dir: Path, result, checkpoint: int | None) -> None:
    """A job folder scored before its training ended: its final checkpoint is a partial one, which the run's scores
    then stand for until the finished job is scored (as `export` notes)."""
    import sys

    from rla_ablate.train import JobConfig

    if checkpoint is not None:
        return
    try:
        total = JobConfig.model_validate_json((job_dir / "job.json").read_text(encoding="utf-8")).train.total_tokens
    except (OSError, ValueError):
        return
    if result.tokens < total:
        from rla_ablate.evals.core import unfinished_note

        print(unfinished_note(job_dir, result.tokens, total, "this scored"), file=sys.stderr)
