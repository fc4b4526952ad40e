"""`rla-sweep export JOB_DIR OUT`: a job's checkpoint as a Hugging Face folder (AutoModelForCausalLM, lm_eval hf)."""

from __future__ import annotations


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a job's checkpoint as a Hugging Face model folder",
        description="Write the final (or --checkpoint) checkpoint of JOB_DIR to OUT: config.json with auto_map, "
                    "safetensors weights, tokenizer files and modeling_rla_sweep.py. Load it with "
                    "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True) or lm_eval --model hf "
                    "--model_args pretrained=OUT,trust_remote_code=True (the rla-sweep package must be installed).")
    parser.add_argument("job_dir", metavar="JOB_DIR", help="a job folder (job.json, checkpoints/)")
    parser.add_argument("out", metavar="OUT", help="the folder to write")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="TOKENS", help="the checkpoint at TOKENS")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT")
    parser.set_defaults(func=run)


def run(args) -> int:
    from rla_ablate.evals.export import export_job

    import sys

    out, tokens, total = export_job(args.job_dir, args.out, args.checkpoint, force=args.force)
    print(f"exported {args.job_dir} ({tokens:,} of {total:,} tokens) to {out}")
    if args.checkpoint is None and tokens < total:
        from pathlib import Path

        from rla_ablate.evals.core import unfinished_note

        print(unfinished_note(Path(args.job_dir), tokens, total, "it exported"), file=sys.stderr)
    return 0
