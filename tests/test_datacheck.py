"""The plan-time data dry run (rla_ablate.sweep.datacheck): `plan` and `launch` open every distinct data config and
eval set once and take a batch; one that cannot be read is exit 2 naming the sweep file's line and key, and a
launch then creates nothing. No Ray, no MLflow, no training here."""

from __future__ import annotations

from pathlib import Path

import yaml

from rla_ablate.cli import main
from rla_ablate.data.sources import path_fraction
from rla_ablate.sweep.datacheck import check_data
from rla_ablate.sweep.expand import load_sweep

TINY = {"vocab_size": 257, "num_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "head_dim": 16}
TRAIN = {"tokens": 1024, "seq_len": 32, "micro_batch_size": 2, "batch_tokens": 128, "cpu_threads": 1}


def corpus(folder: Path, validation_fraction: float, *, with_validation: bool) -> Path:
    """Text files named so that the validation split of `validation_fraction` holds some (or none) of them."""
    folder.mkdir()
    kept = {True: 0, False: 0}
    i = 0
    while kept[False] < 3 or (with_validation and kept[True] < 2):
        name = f"doc{i}.txt"
        i += 1
        is_val = path_fraction(name) < validation_fraction
        if is_val and not with_validation:
            continue
        (folder / name).write_text(f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 40)
        kept[is_val] += 1
    return folder


def sweep_file(tmp_path: Path, data: dict, eval_data: dict, **extra) -> Path:
    doc = {"name": "dry", "models": [{"preset": "tiny-rla", "overrides": TINY}],
           "base": {"train": TRAIN, "data": data, "eval": [{"name": "val", "data": eval_data, "tokens": 256}]},
           **extra}
    f = tmp_path / "dry.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def line_of(f: Path, text: str) -> int:
    return next(i for i, line in enumerate(f.read_text().splitlines(), 1) if text in line)


def test_good_configs_are_opened_once_each(tmp_path, capsys):
    docs = corpus(tmp_path / "docs", 0.5, with_validation=True)
    f = sweep_file(tmp_path, {"kind": "text", "path": str(docs), "split": "train", "validation_fraction": 0.5},
                   {"kind": "text", "path": str(docs), "split": "validation", "validation_fraction": 0.5},
                   grid={"train.lr": [1.0e-3, 2.0e-3, 3.0e-3]}, seeds=[0, 1])
    sweep = load_sweep(f)
    assert len(sweep.jobs) == 6
    checked = check_data(sweep)
    # Six jobs, one corpus read at one length: one training config and one eval set, each opened once.
    assert (checked.data, checked.evals) == (1, 1)
    assert main(["plan", str(f)]) == 0
    assert "1 training data config and 1 eval set each yielded a batch" in capsys.readouterr().out


def test_a_second_sequence_length_is_a_second_check(tmp_path):
    f = sweep_file(tmp_path, {"kind": "stdlib"}, {"kind": "stdlib", "split": "validation"},
                   grid={"train.seq_len": [32, 64]})
    checked = check_data(load_sweep(f))
    assert (checked.data, checked.evals) == (2, 2)


def test_an_empty_validation_split_is_exit_2_at_its_line(tmp_path, capsys):
    docs = corpus(tmp_path / "docs", 0.05, with_validation=False)
    f = sweep_file(tmp_path, {"kind": "text", "path": str(docs), "split": "train", "validation_fraction": 0.05},
                   {"kind": "text", "path": str(docs), "split": "validation", "validation_fraction": 0.05})
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:{line_of(f, 'split: validation')}: base.eval.0.data.split:" in err, err
    assert "the eval set 'val' (kind text) cannot be read" in err and "falls in the validation split" in err
    assert "Traceback" not in err
    # A launch refuses it before anything exists: no sweep folder, no Ray, no MLflow.
    root = tmp_path / "runs"
    assert main(["launch", str(f), "--root", str(root)]) == 2
    assert "base.eval.0.data.split" in capsys.readouterr().err
    assert not (root / "dry").exists()


def test_a_corpus_shorter_than_one_window_is_exit_2_at_its_section(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    f = sweep_file(tmp_path, {"kind": "stdlib"}, {"kind": "stdlib", "split": "validation"},
                   models=[{"preset": "tiny-rla", "overrides": TINY,
                            "base": {"data": {"kind": "text", "path": str(short)}}}])
    assert main(["plan", str(f)]) == 2
    err = capsys.readouterr().err
    # The arm's own data section is at fault, not the shared one.
    assert f"{f}:{line_of(f, 'data:')}: models.0.base.data:" in err, err
    assert "the training data (kind text) cannot be read" in err and "fewer than seq_len + 1 = 33" in err
