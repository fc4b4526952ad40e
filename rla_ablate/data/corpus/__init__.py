"""The embedded default corpus: a snapshot of Python's standard library sources and documentation.

`stdlib.jsonl.gz` holds one JSON object per file, `{"path", "split", "text"}`, in a fixed order; it is built once
by `python -m rla_ablate.data.corpus.build` and committed, so every machine and Python version reads the same bytes.
`stdlib.manifest.json` records where it came from and the SHA-256 of its uncompressed content. Licence: PSF License
Version 2 (see `LICENSE`).
"""
