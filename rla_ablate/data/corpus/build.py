"""Build the embedded corpus snapshot from Python's standard library sources and documentation.

Run once by a maintainer; the output is committed and never rebuilt at run time:

    apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb /tmp/pydoc
    python -m rla_ablate.data.corpus.build --docs /tmp/pydoc/usr/share/doc/python3.11/html/_sources \
        --docs-origin "Debian package python3.11-doc 3.11.2-6+deb12u8"

Content: the reST sources of the tutorial, language reference, HOWTOs, FAQ, glossary and library reference, then
top-level standard library modules in an order fixed by the SHA-256 of their names, added while the compressed
snapshot stays under the size cap. A file goes to the validation split when the SHA-256 of its path falls in the
lowest `VALIDATION_PER_MILLE` thousandths, so the split depends on nothing but the path.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import sysconfig
from pathlib import Path

from rla_ablate.data.sources import path_fraction

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "stdlib.jsonl.gz"
MANIFEST = HERE / "stdlib.manifest.json"
DOC_SECTIONS = ("tutorial", "reference", "howto", "faq", "library")
DOC_SINGLE_FILES = ("glossary.rst.txt",)
VALIDATION_PER_MILLE = 50
MAX_COMPRESSED_BYTES = 2_950_000


def split_of(path: str) -> str:
    return "validation" if path_fraction(path) * 1000 < VALIDATION_PER_MILLE else "train"


def _doc_files(docs: Path) -> list[tuple[str, Path]]:
    files = []
    for section in DOC_SECTIONS:
        for p in sorted((docs / section).rglob("*.rst.txt")):
            files.append((f"Doc/{p.relative_to(docs).as_posix()[:-4]}", p))
    for name in DOC_SINGLE_FILES:
        files.append((f"Doc/{name[:-4]}", docs / name))
    return files


def _module_files(stdlib: Path) -> list[tuple[str, Path]]:
    modules = [p for p in stdlib.glob("*.py") if not p.name.startswith("_") or p.name == "__future__.py"]
    modules.sort(key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
    return [(f"Lib/{p.name}", p) for p in modules]


def _record(name: str, path: Path) -> bytes:
    text = path.read_bytes().decode("utf-8")
    line = json.dumps({"path": name, "split": split_of(name), "text": text}, ensure_ascii=False, sort_keys=True)
    return (line + "\n").encode("utf-8")


def _gzip(payload: bytes) -> bytes:
    buf = io.BytesIO()
    # mtime=0 and no file name: the compressed bytes depend on the content only.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(payload)
    return buf.getvalue()


def build(docs: Path, stdlib: Path, origin: str) -> dict:
    records = [_record(name, p) for name, p in _doc_files(docs)]
    base = b"".join(records)
    if len(_gzip(base)) > MAX_COMPRESSED_BYTES:
        raise SystemExit("the documentation alone exceeds the size cap")
    modules = [_record(name, p) for name, p in _module_files(stdlib)]
    # Largest prefix of the module list that fits; compressed size grows monotonically with the prefix.
    lo, hi = 0, len(modules)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_gzip(base + b"".join(modules[:mid]))) <= MAX_COMPRESSED_BYTES:
            lo = mid
        else:
            hi = mid - 1
    payload = base + b"".join(modules[:lo])
    SNAPSHOT.write_bytes(_gzip(payload))
    counts = {"train": {"files": 0, "bytes": 0}, "validation": {"files": 0, "bytes": 0}}
    for line in payload.decode("utf-8").splitlines():
        rec = json.loads(line)
        counts[rec["split"]]["files"] += 1
        counts[rec["split"]]["bytes"] += len(rec["text"].encode("utf-8"))
    manifest = {
        "description": "Python standard library documentation (reST sources) and top-level modules",
        "python_docs": origin,
        "python_stdlib": f"CPython {sys.version.split()[0]} Lib/",
        "licence": "PSF License Version 2 (documentation examples also 0BSD); see LICENSE",
        "doc_files": len(records),
        "module_files": lo,
        "validation_per_mille": VALIDATION_PER_MILLE,
        "splits": counts,
        "sha256_uncompressed": hashlib.sha256(payload).hexdigest(),
        "compressed_bytes": SNAPSHOT.stat().st_size,
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, required=True, help="the html/_sources folder of the Python docs")
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                        help="the standard library folder (default: this interpreter's)")
    parser.add_argument("--docs-origin", required=True, help="where the docs came from, for the manifest")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.docs, args.stdlib, args.docs_origin), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
