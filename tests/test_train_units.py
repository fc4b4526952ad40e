"""Unit tests of the training job's parts: config, schedule, divergence guard, JSONL log, checkpoints, RNG."""

from __future__ import annotations

import re

import json
import math
import random
import time
import warnings

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from rla_ablate.models import load_preset
from rla_ablate.errors import Notice
from rla_ablate.train import CompositeLogger, JobConfig, JSONLLogger, TrainConfig, metric_series, read_jsonl
from rla_ablate.train.checkpoint import capture_rng, list_checkpoints, load_checkpoint, load_latest, restore_rng, save_checkpoint
from rla_ablate.train.guard import SPIKE_MIN_STEPS, DivergenceGuard
from rla_ablate.train.loggers import truncate_jsonl
from rla_ablate.train.schedule import lr_at


def test_train_config_defaults_are_the_papers():
    cfg = TrainConfig()
    assert (cfg.lr, cfg.min_lr, cfg.weight_decay, cfg.grad_clip) == (3e-4, 3e-5, 0.1, 1.0)
    assert cfg.batch_tokens == 2**22 and cfg.tokens == 50_000_000_000
    assert cfg.resolved_warmup_tokens == 500_000_000
    assert cfg.micro_batches_per_step == 2**22 // (8 * 2048)


@pytest.mark.parametrize("changes, words", [
    ({"batch_tokens": 1000}, r"multiple of micro_batch_size \* seq_len \* num_workers = 8 \* 2048 \* 1"),
    ({"tokens": 1000}, "exceeds the token budget"),
    ({"min_lr": 1.0}, "must not exceed lr"),
    ({"warmup_tokens": 10**12}, "must be below the token budget"),
    ({"fsdp": True}, "num_workers >= 2"),
    ({"cuda_graphs": True, "device": "cpu"}, "cuda_graphs cannot run with device cpu"),
    ({"cuda_graphs": True, "reset_state_at_documents": True}, "cuda_graphs cannot run with reset_state_at_documents"),
    ({"cuda_graphs": True, "num_workers": 2, "batch_tokens": 2**23}, "cuda_graphs cannot run with num_workers 2"),
    ({"lerning_rate": 1.0}, "Extra inputs"),
])
def test_train_config_rejects(changes, words):
    with pytest.raises(ValidationError, match=words):
        TrainConfig(**changes)


def test_intervals_round_to_whole_steps():
    cfg = TrainConfig(tokens=10_000, seq_len=10, micro_batch_size=10, batch_tokens=1000, eval_every_tokens=2500,
                      log_every_tokens=1)
    assert cfg.total_steps == 10 and cfg.total_tokens == 10_000
    assert cfg.eval_every_steps == 3 and cfg.log_every_steps == 1 and cfg.checkpoint_every_steps == 1
    odd = TrainConfig(tokens=10_500, seq_len=10, micro_batch_size=10, batch_tokens=1000)
    assert odd.total_steps == 11 and odd.total_tokens == 11_000


def test_schedule_warmup_then_cosine_to_the_floor():
    kw = dict(lr=3e-4, min_lr=3e-5, warmup_tokens=1000, total_tokens=11_000)
    assert lr_at(0, **kw) == 0.0
    assert lr_at(500, **kw) == pytest.approx(1.5e-4)
    assert lr_at(1000, **kw) == pytest.approx(3e-4)
    assert lr_at(6000, **kw) == pytest.approx((3e-4 + 3e-5) / 2)
    assert lr_at(11_000, **kw) == pytest.approx(3e-5)
    values = [lr_at(t, **kw) for t in range(1000, 11_001, 500)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def _job(**train):
    model = load_preset("tiny-rla").replace(vocab_size=257)
    return JobConfig(model=model, train=TrainConfig(tokens=4096, seq_len=64, micro_batch_size=2, batch_tokens=512,
                                                    **train))


def test_canonical_json_is_sorted_and_stable():
    a, b = _job(), _job()
    text = a.canonical_json()
    assert text == b.canonical_json()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert _job(lr=1e-3).canonical_json() != text
    # Bookkeeping does not change what a checkpoint must match, the optimizer does.
    assert _job(keep_checkpoints=5).identity_json() == a.identity_json()
    assert _job(lr=1e-3).identity_json() != a.identity_json()
    # CUDA graphs run the eager step's numbers: a job may resume with them on or off. Off, the dump leaves the field
    # out, so earlier jobs keep their ids; on is another job id.
    assert _job(cuda_graphs=True).identity_json() == a.identity_json()
    assert "cuda_graphs" not in text and _job(cuda_graphs=True).canonical_json() != text


def test_a_dumped_job_validates_again():
    # job.json and Ray workers carry the dump; text and recall eval sets both write tokens and examples.
    job = JobConfig.model_validate({
        "model": load_preset("tiny-rla").model_dump(),
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 2048},
                 {"name": "recall", "data": {"kind": "mqar"}, "examples": 16}],
    })
    again = JobConfig.model_validate(json.loads(job.model_dump_json()))
    assert again.canonical_json() == job.canonical_json()
    with pytest.raises(ValidationError, match="counts examples, not tokens"):
        JobConfig.model_validate({"model": load_preset("tiny-rla").model_dump(),
                                  "eval": [{"name": "r", "data": {"kind": "mqar"}, "tokens": 100}]})


def test_job_rejects_repeated_eval_names():
    model = load_preset("tiny-rla")
    evals = [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}}] * 2
    with pytest.raises(ValidationError, match="repeated: val"):
        JobConfig.model_validate({"model": model.model_dump(), "eval": evals})


def test_cuda_graphs_need_cuda():
    assert _job(cuda_graphs=True).train.needs_cuda and not _job().train.needs_cuda


def test_a_graphed_micro_step_needs_cuda():
    from rla_ablate.train.graphs import GraphedMicroStep

    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, not cpu"):
        GraphedMicroStep(lambda ids, labels: ids.sum(), torch.device("cpu"))


def test_job_rejects_a_training_length_other_than_seq_len():
    model = load_preset("tiny-rla").model_dump()
    train = {"tokens": 4096, "seq_len": 64, "micro_batch_size": 2, "batch_tokens": 512}
    with pytest.raises(ValidationError, match=r"data.seq_len \(128\) must equal train.seq_len \(64\)"):
        JobConfig.model_validate({"model": model, "train": train, "data": {"kind": "mqar", "seq_len": 128}})
    job = JobConfig.model_validate({"model": model, "train": train, "data": {"kind": "mqar"}, "eval": []})
    assert job.data.seq_len is None and job.eval == []


def test_guard_skips_non_finite_and_fails_past_the_limit():
    guard = DivergenceGuard(max_skipped_steps=2, spike_zscore=None)
    assert not guard.check(2.0, 1.0).skip
    first = guard.check(float("nan"), 1.0)
    assert first.skip and not first.diverged
    assert guard.check(2.0, float("inf")).skip
    third = guard.check(float("inf"), float("nan"))
    assert third.skip and third.diverged and guard.skipped == 3


def test_guard_flags_a_spike_and_survives_a_round_trip():
    guard = DivergenceGuard(max_skipped_steps=0, spike_zscore=6.0)
    rng = random.Random(0)
    for _ in range(SPIKE_MIN_STEPS + 30):
        assert guard.check(3.0 + 0.01 * rng.random(), 1.0).spike is None
    twin = DivergenceGuard(max_skipped_steps=0, spike_zscore=6.0)
    twin.load_state_dict(guard.state_dict())
    spike = guard.check(4.0, 1.0).spike
    assert spike is not None and spike["zscore"] > 6.0 and spike["loss"] == 4.0
    assert twin.check(4.0, 1.0).spike == spike


def test_jsonl_logger_round_trip_and_truncation(tmp_path):
    path = tmp_path / "m.jsonl"
    log = JSONLLogger(path)
    log.event("start", 0, {"tokens_total": 30})
    for step in (10, 20, 30):
        log.log({"train/loss": step / 10, "train/grad_norm": float("nan")}, step)
    log.close("finished")
    records = read_jsonl(path)
    assert [r["type"] for r in records] == ["event", "metrics", "metrics", "metrics", "close"]
    assert metric_series(records, "train/loss") == [(10, 1.0), (20, 2.0), (30, 3.0)]
    assert math.isnan(metric_series(records, "train/grad_norm")[0][1])
    with open(path, "a") as f:
        f.write('{"type": "metrics", "step": 40, "val')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn last line is a crash mid-write: no warning
        assert len(read_jsonl(path)) == 5
    assert truncate_jsonl(path, 20) == 3
    assert metric_series(read_jsonl(path), "train/loss") == [(10, 1.0), (20, 2.0)]


def test_read_jsonl_names_damaged_lines_inside_the_file(tmp_path):
    path = tmp_path / "m.jsonl"
    log = JSONLLogger(path)
    for step in (10, 20, 30):
        log.log({"train/loss": step / 10}, step)
    log.close("finished")
    lines = path.read_text().splitlines()
    lines[1] = "\x00\x00garbage"
    lines.insert(3, "5")  # valid JSON, not a record
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(Notice, match=r"m\.jsonl: lines 2, 4 are not a metrics record and were skipped"):
        records = read_jsonl(path)
    assert metric_series(records, "train/loss") == [(10, 1.0), (30, 3.0)]
    assert records[-1]["type"] == "close"
    # a resume's rewrite moves them aside, with a warning, rather than losing them
    with pytest.warns(Notice, match=r"m\.jsonl: lines 2, 4 are not a metrics record: moved to .*m\.jsonl\.damaged"):
        assert truncate_jsonl(path, 20) == 4  # the two damaged lines, step 30 and the close record
    assert (tmp_path / "m.jsonl.damaged").read_text() == "\x00\x00garbage\n5\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert metric_series(read_jsonl(path), "train/loss") == [(10, 1.0)]


def test_the_cli_shows_the_projects_warnings_as_one_line(tmp_path, capsys):
    """A warning of the project's code reaches a user of the CLI as 'rla-sweep: warning: ...', without Python's
    file:line and source line."""
    from rla_ablate.cli import _project_warnings

    path = tmp_path / "m.jsonl"
    path.write_text('{"type": "metrics", "step": 1, "time": 0, "values": {}}\njunk\n{"type": "close"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        _project_warnings()
        read_jsonl(path)
    err = capsys.readouterr().err
    assert err == f"rla-sweep: warning: {path}: line 2 is not a metrics record and was skipped\n", err


class _Broken:
    def log(self, metrics, step):
        raise ConnectionError("tracking server down")

    def event(self, name, step, detail):
        raise ConnectionError("tracking server down")

    def close(self, status, reason=None):
        pass


def test_composite_logger_keeps_going_when_one_logger_fails(tmp_path):
    jsonl = JSONLLogger(tmp_path / "m.jsonl")
    both = CompositeLogger(_Broken(), jsonl)
    both.log({"train/loss": 1.0}, 8)
    both.event("info", 8, {"backend": "chunk"})
    both.close("finished")
    assert len(both.errors) == 2 and "ConnectionError" in both.errors[0]
    assert [r["type"] for r in read_jsonl(tmp_path / "m.jsonl")] == ["metrics", "event", "close"]


def test_rng_capture_restores_every_generator():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    state = capture_rng()
    expected = (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    restore_rng(state)
    assert (random.random(), np.random.normal(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == expected


def test_checkpoints_are_atomic_weights_only_and_pruned(tmp_path):
    model = torch.nn.Linear(3, 2)
    for tokens in (100, 200, 300):
        save_checkpoint(tmp_path, tokens, {"model": model.state_dict(), "rng": [capture_rng()], "note": "x"}, keep=2)
    # A torn write (a crash between temp file and rename) is not a checkpoint.
    (tmp_path / "checkpoints" / ".ckpt-000000000000400.pt.1.tmp").write_bytes(b"partial")
    assert [t for t, _ in list_checkpoints(tmp_path)] == [200, 300]
    path, state = load_latest(tmp_path)
    assert state["tokens"] == 300 and path.name == "ckpt-000000000000300.pt"
    assert torch.equal(state["model"]["weight"], model.weight)
    restore_rng(state["rng"][0])
    # A newest file that cannot be read falls back to the one before, with a warning.
    path.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="unreadable"):
        _, older = load_latest(tmp_path)
    assert older["tokens"] == 200
    with pytest.raises(ValueError, match="format"):
        torch.save({"format": 99}, tmp_path / "other.pt")
        load_checkpoint(tmp_path / "other.pt")


def test_forwarder_relays_rank0_records_and_the_stop_request(tmp_path):
    from rla_ablate.train.distributed import _Forwarder

    path, stop_file = tmp_path / "metrics.jsonl", tmp_path / "STOP"
    rank0 = JSONLLogger(path)
    rank0.event("start", 0, {"tokens_total": 1024})
    seen = []

    class Seen:
        def log(self, metrics, step):
            seen.append(("log", step, metrics))

        def event(self, name, step, detail):
            seen.append(("event", step, name))

        def close(self, status, reason=None):
            seen.append(("close", status))

    forwarder = _Forwarder(path, Seen(), lambda: True, stop_file)
    rank0.log({"train/loss": 2.0}, 512)
    # Half a line (rank 0 mid-write) waits for the rest.
    with open(path, "a") as f:
        f.write('{"type": "metrics", "step": 1024, "time": 0, "values": {"train/loss": 1.')
    forwarder.pump()
    assert seen == [("log", 512, {"train/loss": 2.0})]
    with open(path, "a") as f:
        f.write('5}}\n')
    rank0.close("cancelled")
    forwarder.pump()
    assert seen[1:] == [("log", 1024, {"train/loss": 1.5})]
    # A resume rewrites the file (a new inode) without the records past its checkpoint, then appends.
    truncate_jsonl(path, 512)
    resumed = JSONLLogger(path)
    resumed.event("resumed", 512, {})
    resumed.log({"train/loss": 1.25}, 1024)
    forwarder.pump()
    assert seen[2:] == [("event", 512, "resumed"), ("log", 1024, {"train/loss": 1.25})]
    # What was in the file before the forwarder started (an earlier attempt) is not sent at all.
    assert ("event", 0, "start") not in seen
    forwarder.start()
    # The thread's first poll comes after POLL_S; a loaded machine may start it late, so wait for what it does.
    deadline = time.monotonic() + 30
    while not stop_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    forwarder.done.set()
    forwarder.join()
    assert stop_file.exists()


def test_progress_logger_prints_evals_and_status_without_a_terminal():
    import io

    from rich.console import Console

    from rla_ablate.train import ProgressLogger

    buffer = io.StringIO()
    progress = ProgressLogger("tiny", console=Console(file=buffer, width=200), interactive=False)
    progress.event("start", 0, {"tokens_total": 2048})
    progress.log({"train/loss": 3.25, "train/tokens_per_s": 1000.0}, 1024)
    progress.log({"eval/val/loss": 3.5}, 1024)
    progress.event("loss_spike", 1024, {"zscore": 7.0})
    progress.event("info", 1024, {"cuda_graph": "captured", "after_eager_steps": 2, "capture_s": 0.4})
    progress.event("info", 1024, {"backend": "triton"})  # the backend is the run's tag, not a line
    progress.close("diverged", "diverged at 2048 tokens")
    text = buffer.getvalue()
    assert "tiny 1,024 tokens: micro step captured in a CUDA graph after 2 eager steps (0.4 s)" in text
    assert "triton" not in text
    assert "tiny: 2,048 tokens from 0" in text
    # an eval's line says where the run is, its rate and ETA too (a short job may print no other)
    assert re.search(r"tiny 1.02K/2.05K tokens \(50%\): loss 3.2500, 1,000 tok/s, ETA 0:00:\d\d; eval val 3.5000",
                     text), text
    assert "loss_spike" in text and "tiny: diverged: diverged at 2048 tokens" in text
    assert text.count("1.02K/2.05K") == 1                           # within every_s of the last line: quiet


def test_progress_logger_without_a_terminal_says_where_it_is_between_evals(monkeypatch):
    """A piped `train` printed nothing between evals (minutes, under load): a progress line with the rate and ETA
    comes at least every `every_s` seconds; a resume is said in words, not as a dict."""
    import io

    from rich.console import Console

    from rla_ablate.train import ProgressLogger

    buffer = io.StringIO()
    progress = ProgressLogger("tiny", console=Console(file=buffer, width=200), interactive=False)
    monkeypatch.setattr(progress, "every_s", 0.0)
    progress.event("resumed", 1024, {"step": 4, "skipped_checkpoints": [2048]})
    progress.event("start", 1024, {"tokens_total": 4096})
    progress.log({"train/loss": 3.25, "train/tokens_per_s": 1000.0}, 2048)
    text = buffer.getvalue()
    assert "tiny: resumed at 1,024 tokens (step 4); skipped unreadable checkpoints 2048" in text, text
    assert "tiny 2.05K/4.1K tokens (50%): loss 3.2500, 1,000 tok/s, ETA " in text, text
    # the first such line comes after `first_s` (10 s), the next ones every `every_s` (30 s)
    monkeypatch.setattr(ProgressLogger, "first_s", 0.0)
    first = io.StringIO()
    progress = ProgressLogger("tiny", console=Console(file=first, width=200), interactive=False)
    progress.event("start", 0, {"tokens_total": 4096})
    progress.log({"train/loss": 3.5}, 1024)
    progress.log({"train/loss": 3.25}, 2048)
    assert "tiny 1.02K/4.1K tokens (25%): loss 3.5000" in first.getvalue() and "2.05K/4.1K" not in first.getvalue()
    # a pipe at rich's default 80 columns: each record is one line, never wrapped mid-record
    narrow = io.StringIO()
    progress = ProgressLogger("tiny-rla/no_output_gates/seed0", console=Console(file=narrow, width=80),
                              interactive=False)
    progress.event("start", 0, {"tokens_total": 4096})
    progress.log({"train/loss": 3.25, "train/tokens_per_s": 1000.0}, 2048)
    progress.log({"eval/val/loss": 3.5, "eval/niah_2k/loss": 4.25}, 2048)
    progress.close("finished")
    lines = narrow.getvalue().splitlines()
    assert any(len(line) > 80 and line.endswith("; eval niah_2k 4.2500 val 3.5000") for line in lines), lines
    assert lines[-1] == "tiny-rla/no_output_gates/seed0: finished", lines


def test_progress_logger_without_a_terminal_says_a_long_step_is_still_running(monkeypatch):
    """A piped `train` whose step outlasts `every_s` (a large batch on the CPU: minutes) printed nothing after its
    first line: a thread says it is still running, with the time since the loop's last record, until the next one
    comes; nothing of it after the run's last line."""
    import io

    from rich.console import Console

    from rla_ablate.train import ProgressLogger

    buffer = io.StringIO()
    progress = ProgressLogger("tiny", console=Console(file=buffer, width=200), interactive=False)
    monkeypatch.setattr(progress, "every_s", 1.0)
    progress.event("start", 0, {"tokens_total": 4096})
    deadline = time.monotonic() + 10
    while "still running" not in buffer.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(r"tiny 0/4.1K tokens \(0%\): still running, no record for \d+ s", buffer.getvalue()), \
        buffer.getvalue()
    progress.log({"train/loss": 3.25}, 1024)  # a record: quiet again for every_s
    said = buffer.getvalue().count("still running")
    progress.close("finished")
    time.sleep(0.3)
    assert buffer.getvalue().count("still running") == said and buffer.getvalue().endswith("tiny: finished\n")
    assert not progress._beat.is_alive()


def test_an_exception_line_is_cut_after_a_sentence_or_says_it_was_cut():
    from rla_ablate.errors import exception_line

    torn = RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory. This is "
                        "an internal miniz error. If you are seeing this error, there is a high likelihood that your "
                        "checkpoint file is corrupted.\nsecond line")
    assert exception_line(torn, 120) == ("RuntimeError: PytorchStreamReader failed reading zip archive: failed "
                                         "finding central directory. This is an internal miniz error.")
    assert exception_line(ValueError("x" * 50), 20) == "ValueError: " + "x" * 19 + "…"
    assert exception_line(ValueError("short. text"), 200) == "ValueError: short. text"
    assert exception_line(KeyError()) == "KeyError"
