"""`rla-sweep data prepare SRC OUT`: tokenize a text file/folder or a saved HF dataset into memory-mapped shards.

`rla-sweep data show CONFIG`: what a data config (a YAML file holding `data:` or a bare data mapping), or data named
as `train --data` names it, yields.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

from rla_ablate.errors import UserError, keys_under


def _is_hf_dataset(path: Path) -> bool:
    """A folder written by datasets' save_to_disk."""
    return any((path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json"))


def _source_config(src: str, args):
    from pydantic import ValidationError

    from rla_ablate.data.config import HFDiskData, JsonlData, StdlibData, TextData
    from rla_ablate.data.sources import folder_data, json_lines

    common = {"tokenizer": args.tokenizer, "eos_token": args.eos_token}
    path = Path(src)
    if src != "stdlib" and not path.exists():
        raise UserError(f"no such file or folder: {path}", key="SRC")
    text = src != "stdlib" and not (path.is_dir() and _is_hf_dataset(path))
    if args.glob != GLOB and not (text and path.is_dir()):
        what = ("the embedded corpus" if src == "stdlib" else f"{path} is a file, which" if text
                else f"{path} is a saved HF dataset, which")
        raise UserError(f"applies to folders of text files only; {what} has no files to match", key="--glob")
    try:
        if src == "stdlib":
            return StdlibData(split=args.split or "train", **common)
        if not text:
            return HFDiskData(path=path, split=args.split, text_column=args.text_column, **common)
        if args.split:
            raise UserError("applies to the embedded corpus and to HF datasets only", key="--split")
        glob = args.glob if args.glob != GLOB else None  # given, not the text default
        if glob is None and path.is_dir():  # the folder's one kind of file (its glob for .ndjson files)
            found = folder_data(path, "--glob (e.g. --glob '**/*.jsonl')")
            records, glob = found["kind"] == "jsonl", found.get("glob")
        else:
            records = json_lines(path, glob)
        if records:  # a document per record
            return JsonlData(path=path, text_field=args.text_column, **common, **({"glob": glob} if glob else {}))
        if args.text_column != TEXT_COLUMN:
            raise UserError(f"applies to HF datasets and JSON Lines only; {path} is read as text files",
                            key="--text-column")
        return TextData(path=path, glob=args.glob, **common)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserError(err["msg"].removeprefix("Value error, "), key=FLAGS.get(str(err["loc"][0]), "SRC")) from None


# The data config's keys as `data prepare` spells them on its command line.
FLAGS = {"path": "SRC", "tokenizer": "--tokenizer", "eos_token": "--eos-token", "glob": "--glob", "split": "--split",
         "text_column": "--text-column", "text_field": "--text-column"}
TEXT_COLUMN = "text"
GLOB = "**/*.txt"


def prepare(args) -> int:
    if args.shard_tokens < 1:
        raise UserError(f"must be >= 1 (got {args.shard_tokens})", key="--shard-tokens")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file; OUT is a folder for index.json and the shards", key="OUT")
    before = set(out.iterdir()) if out.is_dir() else None
    if before and not (out / "index.json").exists():  # (a folder of shards gets ShardWriter's own message)
        named = ", ".join(sorted(p.name for p in before)[:3]) + (", ..." if len(before) > 3 else "")
        raise UserError(f"{out} is not empty ({len(before)} entries: {named}); OUT is a new or empty folder: the "
                        "shards would overwrite files of the same names and mix with the rest", key="OUT")
    try:
        return _prepare(args)
    except UserError as err:  # a data config's key as this command's flag (`glob` read as --glob)
        _remove_what_was_made(out, before)
        if err.key in FLAGS and not err.file:
            raise UserError(err.message, key=FLAGS[err.key]) from None
        raise
    except BaseException:
        _remove_what_was_made(out, before)
        raise


def _remove_what_was_made(out: Path, before: set[Path] | None) -> None:
    """A failed run leaves nothing half-made: the folder it created, or the files it added to an existing one."""
    if before is None:
        shutil.rmtree(out, ignore_errors=True)
    elif out.is_dir():
        for path in set(out.iterdir()) - before:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _prepare(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rla_ablate.data.shards import ShardWriter, choose_dtype
    from rla_ablate.data.sources import count_documents, iter_documents, tokenize_documents
    from rla_ablate.data.tokenizer import load_tokenizer
    from rla_ablate.terminal import count

    cfg = _source_config(args.src, args)
    tok = load_tokenizer(cfg.tokenizer, cfg.eos_token)
    dtype = choose_dtype(tok.vocab_size, args.dtype)
    writer = ShardWriter(Path(args.out), dtype=dtype, vocab_size=tok.vocab_size, eos_id=tok.eos_id,
                         tokenizer_file=cfg.tokenizer, eos_token=getattr(tok, "eos_token", None),
                         shard_tokens=args.shard_tokens,
                         source=args.src if args.src == "stdlib" else str(Path(args.src).resolve()),
                         source_split=getattr(cfg, "split", None) if cfg.kind in ("stdlib", "hf_disk") else None)
    total = count_documents(cfg)
    docs = iter_documents(cfg)
    first = next(docs, None)  # read before the bar is drawn: a source unreadable from its start says so alone
    columns = (TextColumn("[bold]tokenizing"), BarColumn(), MofNCompleteColumn(), TextColumn("documents"),
               TextColumn("{task.fields[tokens]:,} tokens"), TimeRemainingColumn())
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task("prepare", total=total, tokens=0)
        tokens = content = empty = 0
        for ids in tokenize_documents(itertools.chain([] if first is None else [first], docs), tok):
            if ids.size:  # an empty document (an HF dataset's blank rows) would add an EOS after an EOS
                writer.add(ids)
                tokens += ids.size + 1
                content += ids.size
            else:
                empty += 1
            progress.update(task, advance=1, tokens=tokens)
    if content == 0:
        # (the run's folder or files are removed by `prepare`) an empty source wrote end-of-document tokens alone,
        # and training on them failed later, far from here
        raise UserError("holds no text: nothing to tokenize (its documents are empty)", key="SRC")
    index = writer.close()
    skipped = f"; {count(empty, 'empty document')} left out" if empty else ""
    print(f"wrote {index['tokens']:,} tokens ({count(index['documents'], 'document')}{skipped}, {dtype}, vocabulary "
          f"{index['vocab_size']}) in {len(index['shards'])} shard(s) to {args.out}")
    print(f"use it with: data: {{kind: shards, path: {Path(args.out).resolve()}}}")
    return 0


def validate_data_file(located):
    """(the data mapping as written, its validated DataConfig) of a loaded YAML data config: `data: {...}`, or the
    mapping alone, filed under `data` so that errors point at the file's own lines (`data show`, `train --data`)."""
    from pydantic import BaseModel

    from rla_ablate.config import LocatedYAML, validate
    from rla_ablate.data import DataConfig

    class _File(BaseModel):
        data: DataConfig

    if isinstance(located.data, dict) and "data" not in located.data and "kind" not in located.data:
        from rla_ablate.config import SWEEP_FILE_KEYS

        sweep = SWEEP_FILE_KEYS & set(located.data)
        raise UserError(("is a sweep file, not a data config (its data is under base: data:); " if sweep else
                         "is not a data config: it names no kind; ")
                        + "give a YAML file holding `data: {kind: ..., ...}`, or that mapping alone; kinds: stdlib, "
                          "text, jsonl, shards, hf_disk, mqar, niah (docs/DATA.md)", file=located.file, line=1)
    if not (isinstance(located.data, dict) and "data" in located.data):
        located = LocatedYAML({"data": located.data}, located.file,
                              {("data",) + k: line for k, line in located.lines.items()})
    return located.data["data"], validate(_File, located, {"data": located.data["data"]}).data


SHORTHANDS = ("stdlib", "mqar", "niah")  # data kinds that need no path: `data show mqar`


def show(args) -> int:
    from rla_ablate.config import load_yaml

    if args.seq_len < 1:
        raise UserError(f"must be >= 1 (got {args.seq_len})", key="--seq-len")
    path = Path(args.config)
    if str(path) in SHORTHANDS and not path.exists():  # as `train --data` takes them
        from rla_ablate.config import LocatedYAML

        located = LocatedYAML({"data": {"kind": str(path)}}, str(path), {})
        return _show(validate_data_file(located)[1], args.seq_len)
    if not path.exists():
        raise UserError(f"no such file or folder; `data show` takes {', '.join(SHORTHANDS)}, a YAML data config, or "
                        "the data as `train --data` names it", file=str(path))
    if path.is_dir() or path.suffix.lower() not in (".yaml", ".yml"):
        # the data itself, as `train --data` names it (a folder of shards or text, a text or JSON Lines file)
        from rla_ablate.commands.train import data_config
        from rla_ablate.config import LocatedYAML

        located = LocatedYAML({"data": data_config(str(path))}, str(path), {})
        with keys_under("data"):  # a key of the config `train --data` would make of it
            return _show(validate_data_file(located)[1], args.seq_len)
    located = load_yaml(path)
    cfg = validate_data_file(located)[1]
    try:
        return _show(cfg, args.seq_len)
    except UserError as exc:
        # what the data turned out to be (a file not UTF-8, a split with no file) at the key's line in the file
        if exc.file is not None or not exc.key or exc.key.startswith("--"):
            raise
        nested = isinstance(located.data, dict) and "data" in located.data
        if exc.key == "data":  # the data as a whole (too few tokens for --seq-len): where its mapping starts
            line = located.lines.get(("data",)) if nested else 1
            raise UserError(exc.message, file=located.file, line=line, key="data") from None
        line = located.lines.get(("data", exc.key) if nested else (exc.key,))
        raise UserError(exc.message, file=located.file, line=line, key=f"data.{exc.key}") from None


def _show(cfg, seq_len: int) -> int:
    """Print what the data config reads; every line once the data has been read (an error prints none of them)."""
    from rla_ablate.data import EvalConfig, make_eval_batches, vocab_size
    from rla_ablate.data.sources import open_source

    lines = [f"kind: {cfg.kind}, vocabulary: {vocab_size(cfg)}"]
    if cfg.kind in ("mqar", "niah"):
        ev = EvalConfig(name="show", data=cfg, examples=1)
        try:
            batch = make_eval_batches(ev, seq_len, 1)[0]
        except UserError as exc:  # the task's own fields fit; the length asked here does not
            raise UserError(f"{seq_len} is too short for this {cfg.kind} task ({exc.message})",
                            key="--seq-len") from None
        tok = open_source(cfg.haystack).tokenizer if cfg.kind == "niah" else None
    else:
        src = open_source(cfg)
        lines.append(f"tokens: {len(src):,}, windows of {seq_len + 1}: {(len(src) - 1) // seq_len:,}")
        batch = make_eval_batches(EvalConfig(name="show", data=cfg, tokens=seq_len), seq_len, 1)[0]
        tok = src.tokenizer
    ids = batch.input_ids[0]
    lines.append(f"first example: {tok.decode(ids) if tok is not None else ids.tolist()}")
    print("\n".join(lines))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="prepare and inspect training data",
                                   description="Prepare and inspect training data.")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = sub.add_parser("prepare", help="tokenize text or a saved HF dataset into memory-mapped shards",
                       description="Tokenize SRC into memory-mapped shards in OUT (read with "
                                   "`data: {kind: shards, path: OUT}`).")
    p.add_argument("src", metavar="SRC", help="a text file, a folder of text files, a JSON Lines file or folder "
                                              "(.jsonl: a document per record), a folder written by datasets' "
                                              "save_to_disk, or 'stdlib' (the embedded corpus)")
    p.add_argument("out", metavar="OUT", help="a new folder for index.json and the shard files")
    p.add_argument("--tokenizer", type=Path, help="a tokenizers JSON file (default: UTF-8 bytes)")
    p.add_argument("--eos-token", help="the end-of-document token of the tokenizer (default: guessed)")
    p.add_argument("--dtype", choices=["uint16", "uint32"], help="token width (default: uint16 if it fits)")
    p.add_argument("--glob", default=GLOB, help=f"files of a folder to read (default: {GLOB})")
    p.add_argument("--split", help="HF DatasetDict split, or train/validation of the embedded corpus")
    p.add_argument("--text-column", default=TEXT_COLUMN,
                   help="HF dataset column, or JSON Lines records' key, with the text (default: text)")
    p.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard file (default: 2^28)")
    p.set_defaults(func=prepare)
    s = sub.add_parser("show", help="print the vocabulary, size and first example of a data config",
                       description="Print what a data config yields: vocabulary, size, first example.")
    s.add_argument("config", metavar="CONFIG", type=Path,
                   help="YAML with a `data:` mapping (or a bare one), stdlib, mqar, niah, or the data as `train --data` "
                        "takes it (a shards or text folder, a text or JSON Lines file)")
    s.add_argument("--seq-len", type=int, default=256, help="sequence length (default: 256)")
    s.set_defaults(func=show)
