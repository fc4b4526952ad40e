"""CLI subcommands: one module each, discovered by `rla_ablate.cli` (add a file, get a command)."""
