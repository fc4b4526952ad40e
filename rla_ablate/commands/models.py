"""`rla-sweep models`: the model presets with their size and cost, computed analytically (nothing is built)."""

from __future__ import annotations

import argparse
import json

DEFAULT_SEQ_LEN = 2048


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models", help="list model presets: params, recurrent state, FLOPs/token",
        description="List the presets in models/ with params, recurrent state elements per layer "
                    "(transformer: KV-cache elements per token) and training FLOPs per token.")
    parser.add_argument("presets", nargs="*", metavar="PRESET",
                        help="preset names or YAML paths (default: every preset in models/)")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN,
                        help=f"context length for FLOPs/token (default {DEFAULT_SEQ_LEN})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def rows(names: list[str], seq_len: int) -> list[dict]:
    from rla_ablate.models import (count_params, flops_per_token, load_preset, non_embedding_params,
                                   state_elements_per_layer)

    out = []
    for name in names:
        cfg = load_preset(name)
        out.append({"preset": name, "family": cfg.family, "params": count_params(cfg),
                    "non_embedding_params": non_embedding_params(cfg),
                    "state_elements_per_layer": state_elements_per_layer(cfg),
                    "flops_per_token": flops_per_token(cfg, seq_len), "seq_len": seq_len})
    return out


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.4g}"


def run(args: argparse.Namespace) -> int:
    from rla_ablate.errors import UserError
    from rla_ablate.models import list_presets

    if args.seq_len < 1:
        raise UserError(f"--seq-len must be >= 1 (got {args.seq_len})")
    names = list(dict.fromkeys(args.presets)) or list_presets()  # a preset named twice is one row
    if not names:
        from rla_ablate.resources import bundled_dir

        raise UserError(f"no model presets (*.yaml) in {bundled_dir('models')}; the installation is incomplete")
    table_rows = rows(names, args.seq_len)
    if args.json:
        print(json.dumps(table_rows, indent=2))
        return 0
    from rich.table import Table

    from rla_ablate.terminal import stdout_console

    table = Table(title=f"Model presets (FLOPs/token: training, forward + backward, seq_len {args.seq_len})")
    for col, justify in (("preset", "left"), ("family", "left"), ("params", "right"), ("non-emb", "right"),
                         ("state/layer", "right"), ("FLOPs/tok", "right")):
        table.add_column(col, justify=justify, no_wrap=True)
    for r in table_rows:
        state = f"{r['state_elements_per_layer']:,}" + (" /tok" if r["family"] == "transformer" else "")
        table.add_row(r["preset"], r["family"], _human(r["params"]), _human(r["non_embedding_params"]), state,
                      _human(r["flops_per_token"]))
    console = stdout_console()
    console.print(table)
    console.print("state/layer: recurrent state elements per layer and sequence (rla/rdn: S and R); "
                  "transformer: KV-cache elements per token of context.")
    return 0
