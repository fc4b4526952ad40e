"""Synthetic recall: MQAR and needle-in-a-haystack answers recomputed from the sequences, determinism, resume."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rla_ablate.data import EvalConfig, MQARData, NIAHData, StdlibData, TextData, make_eval_batches, make_train_stream
from rla_ablate.data.recall import mqar_examples
from rla_ablate.data.tokenizer import ByteTokenizer
from rla_ablate.errors import UserError


def mqar_answers(inputs: np.ndarray, kv: int) -> np.ndarray:
    """The expected label of every position, recomputed from the context alone (-100 where nothing is asked)."""
    out = np.full(inputs.shape, -100)
    for b, row in enumerate(inputs):
        table = dict(zip(row[0:2 * kv:2].tolist(), row[1:2 * kv:2].tolist()))
        for t in range(2 * kv, row.size):
            if row[t] in table:
                out[b, t] = table[row[t]]
    return out


@pytest.mark.parametrize("vocab,kv,seq_len", [(64, 4, 32), (8192, 8, 128), (300, 16, 257)], ids=str)
def test_mqar_answers_are_right(vocab, kv, seq_len):
    cfg = MQARData(vocab_size=vocab, num_kv_pairs=kv, random_non_queries=False)
    inputs, labels = mqar_examples(cfg, seq_len, 123, np.arange(200))
    assert inputs.shape == labels.shape == (200, seq_len)
    keys, values = inputs[:, 0:2 * kv:2], inputs[:, 1:2 * kv:2]
    assert keys.min() >= 1 and keys.max() < vocab // 2 and values.min() >= vocab // 2 and values.max() < vocab
    assert all(len(set(k)) == kv for k in keys.tolist()) and all(len(set(v)) == kv for v in values.tolist())
    # Without noise every non-zero query-region token is a query, and its label is exactly its value.
    assert np.array_equal(labels, mqar_answers(inputs, kv))
    assert ((labels != -100).sum(axis=1) == kv).all()
    asked = [sorted(row[labels[b] != -100].tolist()) for b, row in enumerate(inputs)]
    assert asked == [sorted(k) for k in keys.tolist()]


def test_mqar_noise_and_power_law():
    cfg = MQARData(vocab_size=256, num_kv_pairs=8)
    inputs, labels = mqar_examples(cfg, 256, 9, np.arange(300))
    scored = labels != -100
    assert (scored.sum(axis=1) == 8).all()
    kv_of = [dict(zip(r[0:16:2].tolist(), r[1:16:2].tolist())) for r in inputs]
    assert all(labels[b, t] == kv_of[b][inputs[b, t]] for b, t in zip(*np.nonzero(scored)))
    # Noise fills the rest of the query region with tokens from the whole vocabulary.
    assert len(np.unique(inputs[:, 16:][~scored[:, 16:]])) > 200
    near = np.nonzero(scored)[1].mean()
    _, flat = mqar_examples(MQARData(vocab_size=256, num_kv_pairs=8, power_a=1.0), 256, 9, np.arange(300))
    uniform = np.nonzero(flat != -100)[1].mean()
    # power_a = 0.01 puts queries much closer to the context than the uniform draw (power_a = 1).
    assert near < 0.8 * uniform


def test_mqar_eval_and_train_are_deterministic_and_resumable():
    ev = EvalConfig(name="mqar", data=MQARData(vocab_size=128, num_kv_pairs=4, seq_len=64), examples=10)
    a, b = make_eval_batches(ev, 999, 4), make_eval_batches(ev, 999, 4)
    assert [x.input_ids.shape for x in a] == [(4, 64), (4, 64), (2, 64)]
    assert all(torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels) for x, y in zip(a, b))
    other = make_eval_batches(ev.model_copy(update={"data": ev.data.model_copy(update={"seed": 1})}), 64, 4)
    assert not torch.equal(other[0].input_ids, a[0].input_ids)
    stream = make_train_stream(ev.data, 32, 4, seed=0)
    batches = [next(stream) for _ in range(6)]
    assert not torch.equal(batches[0].input_ids, a[0].input_ids)
    again = make_train_stream(ev.data, 32, 4, seed=0)
    next(again)
    state = again.state_dict()
    resumed = make_train_stream(ev.data, 32, 4, seed=0)
    resumed.load_state_dict(state)
    assert all(torch.equal(next(resumed).input_ids, b.input_ids) for b in batches[1:])


def test_mqar_bad_sizes():
    with pytest.raises(ValueError, match="vocab_size"):
        MQARData(vocab_size=8, num_kv_pairs=8)
    with pytest.raises(UserError, match="num_kv_pairs"):
        mqar_examples(MQARData(num_kv_pairs=8), 20, 0, np.arange(2))


NEEDLE = re.compile(r"\nThe secret code for ([a-z]{6}) is (\d+)\.\n")


@pytest.mark.parametrize("length", [128, 512, 2048])
def test_niah_answers_are_right(length):
    cfg = NIAHData(context_length=length, depths=[0.0, 0.5, 1.0])
    batches = make_eval_batches(EvalConfig(name="niah", data=cfg, examples=6), 64, 4)
    tok = ByteTokenizer()
    seen_keys = set()
    for batch in batches:
        assert batch.input_ids.shape[1] == length
        for i in range(batch.input_ids.shape[0]):
            ids, labels = batch.input_ids[i], batch.labels[i]
            text = tok.decode(ids)
            (key, value), = NEEDLE.findall(text)
            seen_keys.add(key)
            answer = tok.decode(labels[labels != -100])
            assert answer == value and len(value) == cfg.value_digits
            # The answer is scored right after the question, at the very end.
            scored = torch.nonzero(labels != -100).flatten()
            assert scored.tolist() == list(range(length - len(value), length))
            assert text.endswith(f"\nThe secret code for {key} is {value[:-1]}")
            assert torch.equal(labels[scored[:-1]], ids[scored[1:]])
    assert len(seen_keys) == 6


def test_niah_depths_place_the_needle():
    cfg = NIAHData(context_length=1024, depths=[0.0, 1.0])
    batch = make_eval_batches(EvalConfig(name="niah", data=cfg, examples=2), 64, 2)[0]
    first, last = (ByteTokenizer().decode(batch.input_ids[i]) for i in range(2))
    assert first.startswith("\nThe secret code for")
    assert NEEDLE.search(last).end() == last.rindex("\nThe secret code for")


def test_niah_uses_the_haystack_and_checks_lengths(tmp_path):
    (tmp_path / "hay.txt").write_text("grass " * 500)
    cfg = NIAHData(haystack=TextData(path=tmp_path / "hay.txt"), context_length=256)
    text = ByteTokenizer().decode(make_eval_batches(EvalConfig(name="n", data=cfg, examples=1), 64, 1)[0].input_ids[0])
    assert "grass grass" in text and NEEDLE.search(text)
    with pytest.raises(UserError, match="context_length"):
        make_eval_batches(EvalConfig(name="n", data=NIAHData(context_length=64), examples=1), 64, 1)
    with pytest.raises(UserError, match="haystack"):
        make_eval_batches(EvalConfig(name="n", data=cfg.model_copy(update={"context_length": 4096}), examples=1), 64, 1)
    stream = make_train_stream(NIAHData(haystack=StdlibData(), context_length=200), 999, 3, seed=4)
    assert next(stream).input_ids.shape == (3, 200)


def test_mqar_keys_and_order_are_uniform():
    # Floyd's algorithm plus a shuffle: every key equally likely, at every context slot.
    inputs, _ = mqar_examples(MQARData(vocab_size=16, num_kv_pairs=3, random_non_queries=False), 12, 5,
                              np.arange(14_000))
    keys = inputs[:, 0:6:2]
    for slot in range(3):
        counts = np.bincount(keys[:, slot], minlength=8)[1:]
        assert counts.min() > 0.9 * 2000 and counts.max() < 1.1 * 2000
