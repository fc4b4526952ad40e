"""Data: the embedded corpus, text / HF-on-disk sources, stream determinism, resume, DDP ranks, eval sets, errors."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from rla_ablate.config.yamlio import load_yaml_text, validate
from rla_ablate.data import (
    DataConfig,
    EvalConfig,
    HFDiskData,
    StdlibData,
    TextData,
    make_eval_batches,
    make_train_stream,
    vocab_size,
)
from rla_ablate.data.rng import Permutation, random_below
from rla_ablate.data.sources import MANIFEST, SNAPSHOT, iter_documents, open_source
from rla_ablate.data.tokenizer import ByteTokenizer
from rla_ablate.errors import UserError


def take(stream, n):
    return [next(stream) for _ in range(n)]


def same(a, b):
    return all(torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels) for x, y in zip(a, b))


@pytest.fixture
def text_dir(tmp_path):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for i in range(40):
        # Distinct content everywhere, so a window identifies its position.
        words = " ".join(hashlib.sha256(f"{i}/{j}".encode()).hexdigest()[:6] for j in range(i + 3))
        (root / ("sub" if i % 3 else ".") / f"doc{i:02d}.txt").write_text(f"{words} (document {i})")
    (root / "skip.md").write_text("not matched by the default glob")
    return root


def test_snapshot_is_small_intact_and_split_by_file():
    manifest = json.loads(MANIFEST.read_text())
    assert SNAPSHOT.stat().st_size <= 3_000_000
    raw = gzip.decompress(SNAPSHOT.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == manifest["sha256_uncompressed"]
    records = [json.loads(line) for line in io.StringIO(raw.decode("utf-8"))]
    by_split = {s: [r["path"] for r in records if r["split"] == s] for s in ("train", "validation")}
    assert not set(by_split["train"]) & set(by_split["validation"])
    assert len(by_split["validation"]) == manifest["splits"]["validation"]["files"] > 10
    assert any(p.startswith("Doc/") for p in by_split["train"]) and any(p.startswith("Lib/") for p in by_split["train"])


def test_stdlib_tokens_are_golden():
    # The CI asserts a golden loss curve: these exact tokens must come out on every machine and Python version.
    src = open_source(StdlibData())
    assert (len(src), src.vocab_size, src.eos_id) == (9_961_746 + 447, 257, 256)
    stream = make_train_stream(StdlibData(), seq_len=64, batch_size=4, seed=0)
    digest = hashlib.sha256(b"".join(b.input_ids.numpy().tobytes() for b in take(stream, 3))).hexdigest()
    assert digest == GOLDEN_STDLIB_SEED0
    text = ByteTokenizer().decode(open_source(StdlibData(split="validation")).window(0, 2000))
    assert text.isprintable() or "\n" in text


GOLDEN_STDLIB_SEED0 = "00c7b8e1f6884da7cdb034d4b229d527c2fb798b89e924c44033e0a5fab4ba08"


def test_permutation_is_a_bijection_and_seeded():
    for n in (1, 2, 5, 17, 1000, 4097):
        assert sorted(Permutation(n, 7)[np.arange(n)].tolist()) == list(range(n))
    assert not np.array_equal(Permutation(1000, 1)[np.arange(1000)], Permutation(1000, 2)[np.arange(1000)])
    bounded = random_below(3, np.arange(10_000), 7)
    assert bounded.min() == 0 and bounded.max() == 6


def test_stream_is_deterministic_and_shifted(text_dir):
    cfg = TextData(path=text_dir)
    a, b = take(make_train_stream(cfg, 16, 3, seed=5), 6), take(make_train_stream(cfg, 16, 3, seed=5), 6)
    assert same(a, b)
    assert not same(a, take(make_train_stream(cfg, 16, 3, seed=6), 6))
    for batch in a:
        assert batch.input_ids.shape == batch.labels.shape == (3, 16) and batch.input_ids.dtype == torch.int64
        assert torch.equal(batch.labels[:, :-1], batch.input_ids[:, 1:])


def test_every_window_once_per_epoch(tmp_path):
    # One 8-byte record per window, so a window's text names its position.
    n = 300
    (tmp_path / "records.txt").write_text("".join(f"{k:07d}\n" for k in range(n)))
    stream = make_train_stream(TextData(path=tmp_path / "records.txt"), 8, 7, seed=0)
    seen = [int(bytes(row.tolist())) for b in take(stream, 2 * n // 7) for row in b.input_ids]
    assert sorted(seen[:n]) == list(range(n)) and sorted(seen[n:2 * n - 1]) == sorted(set(seen[n:2 * n - 1]))
    assert seen[:n] != sorted(seen[:n]) and seen[:20] != seen[n:n + 20]


def test_resume_continues_the_same_batches(tmp_path, text_dir):
    cfg = TextData(path=text_dir)
    straight = take(make_train_stream(cfg, 16, 2, seed=1), 50)
    first = make_train_stream(cfg, 16, 2, seed=1)
    take(first, 20)
    torch.save({"data": first.state_dict()}, tmp_path / "ckpt.pt")
    resumed = make_train_stream(cfg, 16, 2, seed=1)
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True)["data"])
    assert same(take(resumed, 30), straight[20:])
    other = make_train_stream(cfg, 16, 2, seed=2)
    with pytest.raises(UserError, match="different data"):
        other.load_state_dict(first.state_dict())


def test_ranks_read_disjoint_data(text_dir):
    cfg = TextData(path=text_dir)
    single = take(make_train_stream(cfg, 8, 4, seed=3), 5)
    ranks = [take(make_train_stream(cfg, 8, 2, seed=3, rank=r, world_size=2), 5) for r in range(2)]
    for step in range(5):
        together = torch.cat([ranks[0][step].input_ids, ranks[1][step].input_ids])
        assert torch.equal(together, single[step].input_ids)
    rows = {tuple(b.input_ids[i].tolist()) for r in ranks for b in r for i in range(2)}
    assert len(rows) == 20
    # The position is global: a checkpoint of 2 ranks resumes on 1 rank at the same sample.
    r0 = make_train_stream(cfg, 8, 2, seed=3, rank=0, world_size=2)
    take(r0, 2)
    one = make_train_stream(cfg, 8, 4, seed=3)
    one.load_state_dict(r0.state_dict())
    assert same(take(one, 3), single[2:5])


def test_eval_batches_are_fixed_and_spread(text_dir):
    ev = EvalConfig(name="val", data=TextData(path=text_dir), tokens=100)
    a, b = make_eval_batches(ev, 16, 3), make_eval_batches(ev, 16, 3)
    assert same(a, b) and [x.input_ids.shape[0] for x in a] == [3, 3, 1]
    src = open_source(ev.data)
    count = (len(src) - 1) // 16
    rows = [x.input_ids[i].numpy() for x in a for i in range(len(x.input_ids))]
    # ceil(100 / 16) = 7 windows at c = i * count // 7: spread over the whole set, in order.
    expected = [i * count // 7 for i in range(7)]
    assert all(np.array_equal(src.window(c * 16, c * 16 + 16), row) for c, row in zip(expected, rows))
    assert expected[-1] > count // 2


def test_text_split_by_file(text_dir):
    train = TextData(path=text_dir, split="train", validation_fraction=0.2)
    val = TextData(path=text_dir, split="validation", validation_fraction=0.2)
    everything = TextData(path=text_dir)
    n_train, n_val, n_all = (len(open_source(c)) for c in (train, val, everything))
    assert n_train + n_val == n_all and n_val > 0 and n_train > 0
    md = TextData(path=text_dir, glob="*.md")
    assert ByteTokenizer().decode(open_source(md).window(0, 100)).startswith("not matched")


def small_bpe(text_dir, path):
    """A 120-token BPE tokenizer of the test corpus, saved at `path` (with </s> for the document ends)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([p.read_text() for p in sorted(text_dir.rglob("*.txt"))],
                            trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"]))
    tok.save(str(path))
    return tok


def test_json_tokenizer(tmp_path, text_dir):
    path = tmp_path / "tok.json"
    tok = small_bpe(text_dir, path)
    cfg = TextData(path=text_dir, tokenizer=path)
    src = open_source(cfg)
    assert src.eos_id == tok.token_to_id("</s>") and vocab_size(cfg) == tok.get_vocab_size()
    first_doc = src.window(0, int(np.argmax(src.tokens == src.eos_id)))
    assert src.tokenizer.decode(first_doc).replace(" ", "") == (text_dir / "doc00.txt").read_text().replace(" ", "")
    batch = next(make_train_stream(cfg, 8, 2, seed=0))
    assert int(batch.input_ids.max()) < vocab_size(cfg)
    with pytest.raises(UserError, match="eos_token"):
        open_source(TextData(path=text_dir, tokenizer=path, eos_token="<nope>"))


def test_an_eval_set_tokenized_otherwise_than_the_training_data_is_refused(tmp_path, text_dir):
    """A model trained on a BPE tokenizer's ids and scored on byte tokens gets a meaningless eval loss: `plan` (at
    the sweep file's line) and the job itself refuse it; the same tokenizer in another file, shards prepared with
    it, and MQAR eval sets (synthetic ids) are fine."""

    import yaml

    from rla_ablate.data import MQARData, ShardsData, tokenizer_mismatch

    path = tmp_path / "tok.json"
    small_bpe(text_dir, path)
    shutil.copy(path, tmp_path / "same.json")
    bpe, same, raw = (TextData(path=text_dir, tokenizer=path), TextData(path=text_dir, tokenizer=tmp_path / "same.json"),
                      TextData(path=text_dir))
    assert tokenizer_mismatch(bpe, same) is None and tokenizer_mismatch(raw, raw) is None
    # one file, documents ended by another token: the eval text's separators are ids the model never saw there
    other_eos = TextData(path=text_dir, tokenizer=path, eos_token="<unk>")
    assert tokenizer_mismatch(bpe, TextData(path=text_dir, tokenizer=path, eos_token="</s>")) is None  # the default
    why = tokenizer_mismatch(bpe, other_eos)
    assert why is not None and "with documents ended by token id 0" in why and "token id 1" in why, why
    assert tokenizer_mismatch(bpe, MQARData()) is None
    why = tokenizer_mismatch(bpe, raw)
    assert why.startswith(f"the eval set's text is tokenized by UTF-8 bytes, the training data's by the tokenizer "
                          f"{path}"), why
    shards = tmp_path / "shards"
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "data", "prepare", str(text_dir), str(shards),
                           "--tokenizer", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert tokenizer_mismatch(ShardsData(path=shards), bpe) is None
    assert tokenizer_mismatch(ShardsData(path=shards), raw) is not None
    held_out = tmp_path / "held-out"  # text the shards were not made from (their own folder is refused as such)
    shutil.copytree(text_dir, held_out)
    sweep = {"name": "mixed", "models": [{"preset": "tiny-rla", "overrides": {"vocab_size": 257}}],
             "base": {"train": {"tokens": 1024, "seq_len": 32, "micro_batch_size": 2, "batch_tokens": 64},
                      "data": {"kind": "shards", "path": str(shards)},
                      "eval": [{"name": "val", "data": {"kind": "text", "path": str(held_out)}, "tokens": 64}]}}
    f = tmp_path / "mixed.yaml"
    f.write_text(yaml.safe_dump(sweep, sort_keys=False))
    line = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if text.strip() == "eval:")
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "plan", str(f)], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"mixed.yaml:{line + 1}: base.eval.0: job tiny-rla/seed0, eval set 'val': the eval set's text" in proc.stderr
    sweep["base"]["eval"][0]["data"]["path"] = str(text_dir)  # the folder the shards hold every file of
    f.write_text(yaml.safe_dump(sweep, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "plan", str(f)], capture_output=True, text=True)
    assert proc.returncode == 2 and f"the shards {shards} were prepared from {text_dir}, every file of it" \
        in " ".join(proc.stderr.split()), proc.stderr
    # no eval: at all: the built-in set reads bytes; said at base:, with what to add
    del sweep["base"]["eval"]
    f.write_text(yaml.safe_dump(sweep, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "plan", str(f)], capture_output=True, text=True)
    base = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if text.strip() == "base:")
    assert proc.returncode == 2 and f"mixed.yaml:{base}: base: job tiny-rla/seed0: the file gives no eval:" in proc.stderr
    # `train --data` of such shards leaves the built-in eval set out and says so (the README's workflow)
    from rla_ablate.cli import main

    out = tmp_path / "run"
    assert main(["train", "tiny-rla", "--out", str(out), "--data", str(shards), "--set", "model.vocab_size=257",
                 "--set", "train.tokens=512", "--set", "train.seq_len=32", "--set", "train.batch_tokens=64",
                 "--set", "train.micro_batch_size=2", "--set", "train.cpu_threads=1"]) == 0
    assert json.loads((out / "job.json").read_text())["eval"] == []


def test_eos_token_without_a_tokenizer_file_is_refused(tmp_path, text_dir):
    """The byte tokenizer ends documents with its own token: an eos_token there would be silently ignored."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="without one"):
        TextData(path=text_dir, eos_token="</s>")
    out = tmp_path / "shards"
    proc = subprocess.run([sys.executable, "-m", "rla_ablate.cli", "data", "prepare", str(text_dir), str(out),
                           "--eos-token", "</s>"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--eos-token" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()


def test_hf_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"body": [f"row {i} " * 5 for i in range(30)], "id": list(range(30))}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                          "test": datasets.Dataset.from_dict({"body": ["held out"] * 3, "id": [0, 1, 2]})}
                         ).save_to_disk(str(tmp_path / "dict"))
    single = open_source(HFDiskData(path=tmp_path / "single", text_column="body"))
    assert ByteTokenizer().decode(single.window(0, 11)) == "row 0 row 0"
    assert int((single.tokens == 256).sum()) == 30
    test = open_source(HFDiskData(path=tmp_path / "dict", split="test", text_column="body"))
    assert len(test) == 3 * len("held out") + 3
    with pytest.raises(UserError, match="text_column: column 'text' is not in .*allowed: body, id"):
        open_source(HFDiskData(path=tmp_path / "single"))
    with pytest.raises(UserError, match="split: split 'validation' is not in .*allowed: train, test"):
        open_source(HFDiskData(path=tmp_path / "dict", split="validation", text_column="body"))
    # a column that is not text was made text by str(): 1, 2, 3 trained as digits
    with pytest.raises(UserError, match=r"text_column: column 'id' of .* holds Value\(.*int64.*\), not text; allowed: "
                                        r"a string column \(body\)"):
        open_source(HFDiskData(path=tmp_path / "single", text_column="id"))


class _Job(BaseModel):
    data: DataConfig
    eval: list[EvalConfig] = []


def _error(text: str) -> str:
    with pytest.raises(UserError) as info:
        validate(_Job, load_yaml_text(text, "job.yaml"))
    return str(info.value)


def test_config_errors_name_file_line_and_key(tmp_path):
    missing = tmp_path / "missing"
    msg = _error(f"data:\n  kind: text\n  path: {missing}\n")
    assert msg.startswith("job.yaml:3: data.path:") and str(missing) in msg
    assert "did you mean 'path'" in _error("data:\n  kind: text\n  pth: x\n")
    assert ("data: unknown kind 'txt' (did you mean 'text'?); allowed: stdlib, text, jsonl, shards, hf_disk, mqar, niah"
            in _error("data: {kind: txt}\n"))
    assert "job.yaml:1: data.num_kv_pairs" in _error("data: {kind: mqar, num_kv_pairs: 0}\n")
    msg = _error("data: {kind: stdlib}\neval:\n  - name: v\n    data: {kind: mqar}\n    tokens: 5\n")
    assert "eval.0" in msg and "use examples" in msg
    msg = _error(f"data:\n  kind: niah\n  haystack: {{kind: shards, path: {tmp_path}}}\n")
    assert "data.haystack.path" in msg and "data prepare" in msg
    msg = _error(f"data: {{kind: stdlib, tokenizer: {tmp_path / 'tok.json'}}}\n")
    assert "data.tokenizer" in msg and "tok.json" in msg


def test_runtime_errors_name_the_key(tmp_path, text_dir):
    with pytest.raises(UserError, match="glob: no file under"):
        open_source(TextData(path=text_dir, glob="*.rst"))
    short = tmp_path / "short.txt"
    short.write_text("tiny")
    with pytest.raises(UserError, match="fewer than seq_len"):
        make_train_stream(TextData(path=short), 64, 2, seed=0)
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        open_source(TextData(path=tmp_path / "bin.txt"))


def test_a_file_that_is_not_utf8_says_how_to_fix_it(tmp_path):
    """A single file is converted or replaced; a folder's glob is narrowed (naming the glob it has)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("fine\n")
    (tmp_path / "d" / "b.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(UserError, match="convert it to UTF-8, or point path at UTF-8 text") as info:
        list(iter_documents(TextData(path=tmp_path / "d" / "b.txt")))
    assert info.value.key == "path"
    with pytest.raises(UserError, match=r"narrow glob \(now \*\*/\*.txt\) to the UTF-8 files") as info:
        list(iter_documents(TextData(path=tmp_path / "d")))
    assert info.value.key == "glob"
