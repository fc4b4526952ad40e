"""`rla-sweep data prepare`: shards round-trip to exactly the tokens of the source, through the real CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rla_ablate.cli import main
from rla_ablate.data import (
    EvalConfig,
    HFDiskData,
    JsonlData,
    ShardsData,
    TextData,
    make_eval_batches,
    make_train_stream,
    vocab_size,
)
from rla_ablate.data.sources import iter_documents, open_source
from rla_ablate.errors import UserError


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(12):
        (root / f"{i:02d}.txt").write_text(f"Document {i} — naïve café {'xyz' * i}\nend {i}\n")
    return root


def test_bytes_round_trip_across_many_shards(tmp_path, corpus, capsys):
    out = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(out), "--shard-tokens", "50"]) == 0
    assert "use it with: data: {kind: shards" in capsys.readouterr().out
    index = json.loads((out / "index.json").read_text())
    assert index["dtype"] == "uint16" and index["documents"] == 12 and len(index["shards"]) > 5
    shards, text = open_source(ShardsData(path=out)), open_source(TextData(path=corpus))
    assert len(shards) == len(text) == index["tokens"]
    assert vocab_size(ShardsData(path=out)) == vocab_size(TextData(path=corpus)) == 257
    # Every window, including those that cross shard files, equals the in-memory tokens.
    assert all(np.array_equal(shards.window(a, a + 37), text.window(a, a + 37)) for a in range(0, len(text) - 37, 13))
    a = make_train_stream(ShardsData(path=out), 16, 3, seed=2)
    b = make_train_stream(TextData(path=corpus), 16, 3, seed=2)
    assert all(torch.equal(next(a).input_ids, next(b).input_ids) for _ in range(10))
    ev = make_eval_batches(EvalConfig(name="s", data=ShardsData(path=out), tokens=64), 16, 8)
    assert ev[0].input_ids.shape == (4, 16)


def test_tokenizer_uint32_and_self_contained(tmp_path, corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([p.read_text() for p in corpus.iterdir()],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"]))
    tok_path = tmp_path / "tok.json"
    tok.save(str(tok_path))
    out = tmp_path / "shards32"
    assert main(["data", "prepare", str(corpus), str(out), "--tokenizer", str(tok_path), "--dtype", "uint32"]) == 0
    tok_path.unlink()
    shards = open_source(ShardsData(path=out))
    assert shards.tokenizer.eos_id == shards.eos_id == tok.token_to_id("<|endoftext|>")
    assert (out / "tokens-00000.bin").stat().st_size == 4 * len(shards)
    first = shards.window(0, int(np.argmax(shards.window(0, len(shards)) == shards.eos_id)))
    assert shards.tokenizer.decode(first) == (corpus / "00.txt").read_text()


def test_hf_dataset_and_stdlib_sources(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"content": ["alpha", "beta", "gamma"]})}
                         ).save_to_disk(str(tmp_path / "hf"))
    out = tmp_path / "hf_shards"
    assert main(["data", "prepare", str(tmp_path / "hf"), str(out), "--text-column", "content"]) == 0
    shards = open_source(ShardsData(path=out))
    direct = open_source(HFDiskData(path=tmp_path / "hf", text_column="content"))
    assert np.array_equal(shards.window(0, len(shards)), direct.window(0, len(direct)))
    assert main(["data", "prepare", "stdlib", str(tmp_path / "std"), "--split", "validation"]) == 0
    assert json.loads((tmp_path / "std" / "index.json").read_text())["documents"] > 10


def test_bad_input_exits_2_naming_the_problem(tmp_path, corpus, capsys):
    assert main(["data", "prepare", str(tmp_path / "nope"), str(tmp_path / "o")]) == 2
    assert "SRC: no such file or folder" in capsys.readouterr().err
    out = tmp_path / "done"
    assert main(["data", "prepare", str(corpus), str(out)]) == 0
    assert main(["data", "prepare", str(corpus), str(out)]) == 2
    assert "already holds shards" in capsys.readouterr().err
    # a folder of other files: shards would overwrite same-named ones and mix with the rest; nothing is touched
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "tokens-00000.bin").write_text("old")
    (busy / "notes.txt").write_text("keep")
    assert main(["data", "prepare", str(corpus), str(busy)]) == 2
    assert "OUT: " in (err := capsys.readouterr().err) and "is not empty (2 entries: notes.txt, tokens-00000.bin)" in err
    assert {f.name: f.read_text() for f in busy.iterdir()} == {"tokens-00000.bin": "old", "notes.txt": "keep"}
    (tmp_path / "empty-dir").mkdir()  # an empty folder is as good as a new one
    assert main(["data", "prepare", str(corpus), str(tmp_path / "empty-dir")]) == 0
    assert main(["data", "prepare", str(corpus), str(tmp_path / "x"), "--tokenizer", str(tmp_path / "t.json")]) == 2
    assert "--tokenizer: tokenizer file not found" in capsys.readouterr().err
    # an empty source: no text, so no shards (it wrote one end-of-document token, and training failed later)
    (tmp_path / "empty.txt").write_text("")
    assert main(["data", "prepare", str(tmp_path / "empty.txt"), str(tmp_path / "e")]) == 2
    assert "SRC: holds no text" in capsys.readouterr().err and not (tmp_path / "e").exists()
    # the data config's keys named as this command's flags; a flag that does not apply to text files is refused
    assert main(["data", "prepare", str(corpus), str(tmp_path / "g"), "--glob", "*.md"]) == 2
    assert f"--glob: no file under {corpus} matches '*.md'" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()
    assert main(["data", "prepare", str(corpus), str(tmp_path / "c"), "--text-column", "body"]) == 2
    assert ("--text-column: applies to HF datasets and JSON Lines only" in capsys.readouterr().err
            and not (tmp_path / "c").exists())
    assert main(["data", "prepare", "stdlib", str(tmp_path / "s"), "--glob", "*.md"]) == 2  # it was ignored
    assert ("--glob: applies to folders of text files only; the embedded corpus has no files to match"
            in capsys.readouterr().err and not (tmp_path / "s").exists())
    one = next(corpus.rglob("*.txt"))
    assert main(["data", "prepare", str(one), str(tmp_path / "s"), "--glob", "*.md"]) == 2
    assert (f"--glob: applies to folders of text files only; {one} is a file, which has no files to match"
            in capsys.readouterr().err and not (tmp_path / "s").exists())
    # A truncated shard is caught when the folder is opened, not mid-run.
    with open(out / "tokens-00000.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(UserError, match="should hold"):
        open_source(ShardsData(path=out))
    # a text file named as shards: prepare it into another folder (it was told to write shards into the file)
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=f"{tmp_path / 'empty.txt'} is a file, not a shards folder; tokenize it "
                                              "with `rla-sweep data prepare"):
        ShardsData(path=tmp_path / "empty.txt")
    with pytest.raises(ValidationError, match=f"is one file of the shards folder {out}; give the folder"):
        ShardsData(path=out / "tokens-00000.bin")


def test_json_lines_are_a_document_per_record(tmp_path, capsys):
    """A .jsonl file (or folder of them): each record's text_field is a document, by `data prepare` (--text-column),
    `kind: jsonl` and `train --data`; kind text refuses it (read whole, its keys and quotes were the training text);
    a line that is not an object, or a record without the field, is named with its line."""
    from rla_ablate.commands.train import data_config
    from rla_ablate.data.sources import count_documents

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "body": f"record {i} café"}) + "\n" + ("\n" if i == 3 else "")
                            for i in range(7)))
    cfg = JsonlData(path=docs, text_field="body")
    assert count_documents(cfg) == 7 and list(iter_documents(cfg))[3] == "record 3 café"
    out = tmp_path / "shards"
    assert main(["data", "prepare", str(docs), str(out), "--text-column", "body"]) == 0
    assert "(7 documents," in capsys.readouterr().out
    assert len(open_source(ShardsData(path=out))) == len(open_source(cfg)) == sum(
        len(f"record {i} café".encode()) + 1 for i in range(7))
    assert main(["data", "show", str(out), "--seq-len", "8"]) == 0  # the shards folder as `train --data` takes it
    assert "kind: shards, vocabulary: 257" in capsys.readouterr().out
    assert data_config(str(docs)) == {"kind": "jsonl", "path": str(docs)}
    # the default field, absent: the keys that hold text are named; nothing is written
    assert main(["data", "prepare", str(docs), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"--text-column: {docs}:1: the record has no key 'text'; its keys with text: 'body'" in err, err
    assert not (tmp_path / "x").exists() and "tokenizing" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n[1, 2]\n')
    with pytest.raises(UserError, match=f"{bad}:2: a JSON list, not an object with a text_field"):
        list(iter_documents(JsonlData(path=bad)))
    bad.write_text('{"text": "fine"}\n{"text": 3}\nnot json\n')
    with pytest.raises(UserError, match=f"{bad}:2: the record holds a number at 'text'"):
        list(iter_documents(JsonlData(path=bad)))
    with pytest.raises(UserError, match=f"{docs} is JSON Lines, which kind text would read as one raw document"):
        list(iter_documents(TextData(path=docs)))
    bom = tmp_path / "bom.jsonl"  # as some editors save it
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n')
    assert list(iter_documents(JsonlData(path=bom))) == ["first"]
    # a record ends at a newline alone: U+2028 (valid inside a JSON string) does not split it
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"text": "a\u2028b\x85c"}, ensure_ascii=False) + "\n" + json.dumps({"text": "d"}) + "\n",
                   encoding="utf-8")
    assert count_documents(JsonlData(path=odd)) == 2
    assert list(iter_documents(JsonlData(path=odd))) == ["a\u2028b\x85c", "d"]
    odd.write_bytes(b'{"text": "fine"}\n{"text": "\xff"}\n')
    with pytest.raises(UserError, match=f"{odd}:2: not UTF-8 text \\(invalid start byte at byte 10 of the line\\)"):
        list(iter_documents(JsonlData(path=odd)))


def test_an_empty_document_is_left_out(tmp_path, capsys):
    """An empty document (an empty file, a blank row of a dataset) adds no lone EOS after an EOS: `data prepare`
    leaves it out and says so, and the stream read in memory is the same tokens."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("")
    (corpus / "b.txt").write_text("some text")
    assert main(["data", "prepare", str(corpus), str(tmp_path / "s")]) == 0
    assert "wrote 10 tokens (1 document; 1 empty document left out," in capsys.readouterr().out
    shards, text = open_source(ShardsData(path=tmp_path / "s")), open_source(TextData(path=corpus))
    assert len(shards) == len(text) == 10
    assert np.array_equal(shards.window(0, 10), text.window(0, 10)) and text.window(9, 10)[0] == 256


def test_a_folder_named_without_a_kind_reads_one_kind_of_file(tmp_path, capsys):
    """A folder of .ndjson files is JSON Lines (`data prepare`, `train --data`); a folder of plain text and JSON Lines
    is refused, naming what it holds (a kind's glob would skip the other files without a word); a glob that matches
    nothing names the files the folder has."""
    from rla_ablate.commands.train import data_config

    nd = tmp_path / "nd"
    nd.mkdir()
    (nd / "a.ndjson").write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(3)))
    assert data_config(str(nd)) == {"kind": "jsonl", "path": str(nd), "glob": "**/*.ndjson"}
    assert main(["data", "prepare", str(nd), str(tmp_path / "s")]) == 0
    assert "(3 documents," in capsys.readouterr().out
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("plain")
    for name in ("b.jsonl", "c.jsonl"):
        (mixed / name).write_text('{"text": "record"}\n')
    said = f"{mixed} holds 2 .jsonl files, 1 .txt file, and a folder is read as one kind of file; say which with "
    with pytest.raises(UserError, match=re.escape(said + "a data config file")):
        data_config(str(mixed))
    assert main(["data", "prepare", str(mixed), str(tmp_path / "x")]) == 2
    assert f"SRC: {said}--glob (e.g. --glob '**/*.jsonl')" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main(["data", "prepare", str(mixed), str(tmp_path / "x"), "--glob", "**/*.jsonl"]) == 0
    assert "(2 documents," in capsys.readouterr().out
    with pytest.raises(UserError, match=r"matches '\*\*/\*.jsonl' \(its files: 1 .ndjson file\)"):
        list(iter_documents(JsonlData(path=nd)))


def test_shards_of_the_embedded_corpus_record_their_split(tmp_path, capsys):
    """`data prepare stdlib OUT --split validation` records the split in its index, and training on those shards
    with the embedded validation split as the eval set is refused (their documents are the same)."""
    from rla_ablate.commands.train import build_job

    out = tmp_path / "val"
    assert main(["data", "prepare", "stdlib", str(out), "--split", "validation"]) == 0
    assert json.loads((out / "index.json").read_text())["source_split"] == "validation"
    with pytest.raises(UserError, match=f"the shards {out} were prepared from the embedded corpus' validation split"):
        build_job("tiny-rla", ["train.tokens=8192"], str(out), "cpu")


def test_show_prints_a_config(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text("model: tiny\ndata: {kind: niah, context_length: 200}\n")
    assert main(["data", "show", str(tmp_path / "job.yaml"), "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "kind: niah, vocabulary: 257" in out and "The secret code for" in out
    (tmp_path / "bad.yaml").write_text("kind: mqar\nnum_kv: 3\n")
    assert main(["data", "show", str(tmp_path / "bad.yaml")]) == 2
    assert "bad.yaml:2: data.num_kv: unknown key 'num_kv' (did you mean 'num_kv_pairs'?)" in capsys.readouterr().err
    # a sweep file, or a mapping that names no kind: what to give instead, not pydantic's discriminator wording
    assert main(["data", "show", str(Path(__file__).resolve().parents[1] / "sweeps" / "smoke.yaml")]) == 2
    err = capsys.readouterr().err
    assert "smoke.yaml:1: is a sweep file, not a data config (its data is under base: data:)" in err
    assert "discriminator" not in err
    (tmp_path / "nokind.yaml").write_text("path: corpus\n")
    assert main(["data", "show", str(tmp_path / "nokind.yaml")]) == 2
    assert "nokind.yaml:1: is not a data config: it names no kind; give a YAML file holding `data: {kind: ..." \
        in capsys.readouterr().err
    # a length too short for a synthetic task: the flag at fault is named, not the task's own field
    assert main(["data", "show", "mqar", "--seq-len", "8"]) == 2
    assert "--seq-len: 8 is too short for this mqar task (seq_len=8 leaves room for" in capsys.readouterr().err
    # what the data turns out to be is said at its key's line, and nothing is printed before the error
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    for text, line in ((f"data:\n  kind: text\n  path: {tmp_path / 'latin1.txt'}\n", 3),
                       (f"kind: text\npath: {tmp_path / 'latin1.txt'}\n", 2)):
        (tmp_path / "notutf8.yaml").write_text(text)
        assert main(["data", "show", str(tmp_path / "notutf8.yaml")]) == 2
        out, err = capsys.readouterr()
        assert f"notutf8.yaml:{line}: data.path: {tmp_path / 'latin1.txt'} is not UTF-8 text" in err and out == "", err
    # the data as a whole, too short for the windows asked: at its mapping's line, under `data` (not data.data)
    (tmp_path / "short.txt").write_text("hello")
    (tmp_path / "short.yaml").write_text(f"data:\n  kind: text\n  path: {tmp_path / 'short.txt'}\n")
    assert main(["data", "show", str(tmp_path / "short.yaml")]) == 2
    err = capsys.readouterr().err
    assert "short.yaml:1: data: the data at" in err and "fewer than seq_len + 1 = 257" in err, err
