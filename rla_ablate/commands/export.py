"""`rla-sweep export JOB_DIR OUT`: a job's checkpoint as a Hugging Face folder (AutoModelForCausalLM, lm_eval hf).

`rla-sweep export JOB OUT --sweep NAME`: the job of a launched sweep that JOB names (its name or id, as `status`
shows it)."""

from __future__ import annotations

from pathlib import Path

from rla_ablate.environment import add_root_option


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a job's checkpoint as a Hugging Face model folder",
        description="Write the final (or --checkpoint) checkpoint of JOB_DIR to OUT: config.json with auto_map, "
                    "safetensors weights, tokenizer files and modeling_rla_sweep.py. Load it with "
                    "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True) or lm_eval --model hf "
                    "--model_args pretrained=OUT,trust_remote_code=True (the rla-sweep package must be installed).")
    parser.add_argument("job_dir", metavar="JOB_DIR",
                        help="a job folder (job.json, checkpoints/); with --sweep, a job's name or id as `status` "
                             "shows it (tiny-rla/seed0, 3f2a9c1b)")
    parser.add_argument("out", metavar="OUT", help="the folder to write")
    parser.add_argument("--sweep", default=None, metavar="NAME", help="the launched sweep whose job JOB_DIR names")
    add_root_option(parser, "the launch's --root, with --sweep")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="TOKENS", help="the checkpoint at TOKENS")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT")
    parser.set_defaults(func=run)


def run(args) -> int:
    from rla_ablate.evals.export import export_job

    import sys

    if args.sweep is not None:
        from rla_ablate.sweep.status import sweep_job_folder

        args.job_dir = str(sweep_job_folder(args.root, args.sweep, args.job_dir, key="JOB_DIR"))
    elif not Path(args.job_dir).exists():
        from rla_ablate.errors import UserError
        from rla_ablate.sweep.state import SweepDir
        from rla_ablate.sweep.status import sweeps_with_job
        from rla_ablate.fileio import shell_arg

        if "/" not in args.job_dir and SweepDir(args.root, args.job_dir).exists():  # a sweep where a job belongs
            raise UserError(f"{args.job_dir} is a sweep; export takes one of its jobs: `rla-sweep export JOB OUT "
                            f"--sweep {args.job_dir}`, JOB a name or id from `rla-sweep status {args.job_dir}`",
                            key="JOB_DIR")
        owners = sweeps_with_job(args.root, args.job_dir)
        if owners:  # a sweep job's name or id, given without its sweep
            raise UserError(f"no folder {args.job_dir}; it names a job of sweep{'s' * (len(owners) > 1)} "
                            f"{', '.join(owners)}: `rla-sweep export {shell_arg(args.job_dir)} {shell_arg(args.out)} "
                            f"--sweep {owners[0]} --root {shell_arg(args.root)}`", key="JOB_DIR")
    out, tokens, total = export_job(args.job_dir, args.out, args.checkpoint, force=args.force)
    print(f"exported {args.job_dir} ({tokens:,} of {total:,} tokens) to {out}")
    if args.checkpoint is None and tokens < total:
        from rla_ablate.evals.core import unfinished_note

        print(unfinished_note(Path(args.job_dir), tokens, total, "it exported"), file=sys.stderr)
    return 0
