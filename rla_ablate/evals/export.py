"""`rla-sweep export JOB_DIR OUT`: a job's checkpoint as a standard Hugging Face folder.

OUT holds config.json (model_type `rla_sweep`, `auto_map` to the modeling file), the weights (safetensors),
the tokenizer files (the job's tokenizer as a fast HF tokenizer) and `modeling_rla_sweep.py`, so that
`AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)` and
`lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True` load it. The modeling file re-exports the
classes of `rla_ablate.models.hf`: the loading environment needs the `rla-sweep` package (the layers and ops).
"""

from __future__ import annotations

import json
from pathlib import Path

from rla_ablate.errors import UserError
from rla_ablate.fileio import check_folder, make_folder, umask_mode

MODELING_FILE = "modeling_rla_sweep.py"
# What trust_remote_code imports: the package's own classes, so an export and a checkpoint never disagree.
MODELING_CODE = '''"""Hugging Face classes of rla-sweep (needs the rla-sweep package: pip install rla-sweep)."""

from rla_ablate.models.hf import RLASweepConfig, RLASweepForCausalLM

__all__ = ["RLASweepConfig", "RLASweepForCausalLM"]
'''
AUTO_MAP = {"AutoConfig": "modeling_rla_sweep.RLASweepConfig",
            "AutoModelForCausalLM": "modeling_rla_sweep.RLASweepForCausalLM"}


def export_job(job_dir: str | Path, out: str | Path, tokens: int | None = None, *,
               force: bool = False) -> tuple[Path, int, int]:
    """Write the job's final (or `tokens`) checkpoint to `out` as an HF folder; returns (`out`, the checkpoint's
    tokens, the job's token budget)."""
    from rla_ablate.evals.core import hf_tokenizer, load_job, load_weights
    from rla_ablate.models.hf import RLASweepForCausalLM

    job, tokens, ckpt = load_job(job_dir, tokens, sweep_names=False)
    out = Path(out)
    check_folder(out, "OUT", "the exported model")
    if out.exists() and any(out.iterdir()) and not force:
        raise UserError(f"{out} exists and is not empty; give a new folder or --force", key="OUT")
    hf = RLASweepForCausalLM.from_model_config(job.model)
    load_weights(hf.model, ckpt)
    hf.config.auto_map = dict(AUTO_MAP)
    # lm-eval and generate read the context length from here.
    hf.config.max_position_embeddings = int(job.train.seq_len)
    tok = hf_tokenizer(job.data)
    hf.config.eos_token_id = hf.config.pad_token_id = tok.eos_token_id
    tok.model_max_length = int(job.train.seq_len)
    make_folder(out, "OUT", "the exported model")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars among the command's own lines
    hf.save_pretrained(out)
    tok.save_pretrained(out)
    (out / MODELING_FILE).write_text(MODELING_CODE, encoding="utf-8")
    (out / "rla_sweep_export.json").write_text(json.dumps(
        {"job_dir": str(Path(job_dir).resolve()), "checkpoint": ckpt.name, "tokens": tokens}, indent=1),
        encoding="utf-8")
    for weights in out.glob("*.safetensors"):
        umask_mode(weights)
    return out, tokens, job.train.total_tokens
