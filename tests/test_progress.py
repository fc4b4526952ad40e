"""Launch progress: tokens/s and ETAs from fed token reports on a fake clock (no sleeping, no Ray)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from rla_ablate.outcome import Status
from rla_ablate.sweep.progress import PROGRESS_EVERY_S, Progress, RateMeter, fmt_duration


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def job(job_id: str, name: str, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(job_id=job_id, name=name, tokens_target=tokens)


def test_fmt_duration():
    assert [fmt_duration(s) for s in (None, -1, 0, 36.4, 250, 3600 * 2 + 300, 86400 * 3 + 3600 * 4)] == \
        ["-", "-", "0s", "36s", "4m10s", "2h05m", "3d04h"]


def test_rate_meter_skips_the_start_and_smooths():
    m = RateMeter(tau_s=30.0)
    m.add(0.0, 0)
    # Up to the first increase: the attempt's start (model build, a resume's jump to its checkpoint).
    m.add(40.0, 2048)
    assert m.rate is None
    for k in range(1, 11):
        m.add(40.0 + 2 * k, 2048 + 1000 * k)
    assert m.rate == pytest.approx(500.0)
    # A slower interval moves the estimate part of the way only.
    m.add(72.0, 2048 + 11000)
    assert 200 < m.rate < 500
    # Tokens going back (a retry from an earlier checkpoint) start over.
    m.add(80.0, 1024)
    assert m.rate is None


def _feed(progress: Progress, clock: Clock, jobs: list, seconds: int, rates: list[int], tokens: list[int]) -> None:
    for _ in range(seconds):
        clock.t += 1.0
        for i, j in enumerate(jobs):
            tokens[i] += rates[i]
            progress.update(j, Status.RUNNING, tokens[i])
        progress.refresh()


def test_line_mode_prints_rates_and_etas_every_period():
    clock, out = Clock(), io.StringIO()
    progress = Progress("s", console=Console(file=out, width=300, soft_wrap=True), interactive=False, clock=clock)
    a, b, c = job("aaaaaaaa1111", "rla", 60_000), job("bbbbbbbb2222", "gdn", 100_000), job("cccccccc3333", "x", 40_000)
    for j in (a, b, c):
        progress.update(j, Status.PENDING, 0)
    progress.update(c, Status.FINISHED, 40_000)
    # No line while nothing runs, however long the wait.
    clock.t += 100.0
    progress.refresh()
    progress.update(a, Status.RUNNING, 0)
    progress.update(b, Status.RUNNING, 0)
    tokens = [0, 0]
    _feed(progress, clock, [a, b], int(PROGRESS_EVERY_S) - 1, [1000, 500], tokens)
    assert "tok/s" not in out.getvalue()
    _feed(progress, clock, [a, b], 1, [1000, 500], tokens)
    lines = [ln for ln in out.getvalue().splitlines() if "tok/s" in ln]
    assert len(lines) == 1
    line = lines[0]
    assert re.match(r"^\[\d\d:\d\d\] 2 running, 1 finished: 1\.5k tok/s, sweep ETA ~\w+; ", line), line
    # rla: 30k of 60k at 1k tok/s -> 30 s; gdn: 15k of 100k at 500 tok/s -> 2m50s; sweep: 115k / 1.5k -> 1m17s.
    assert "rla (aaaaaaaa) 30k/60k 1k tok/s ETA 30s" in line
    assert "gdn (bbbbbbbb) 15k/100k 500 tok/s ETA 2m50s" in line
    assert "sweep ETA ~1m17s" in line
    _feed(progress, clock, [a, b], int(PROGRESS_EVERY_S), [1000, 500], tokens)
    assert len([ln for ln in out.getvalue().splitlines() if "tok/s" in ln]) == 2


def test_gaps_between_jobs_pause_the_line_period():
    clock, out = Clock(), io.StringIO()
    progress = Progress("s", console=Console(file=out, width=300, soft_wrap=True), interactive=False, clock=clock)
    a, b = job("aaaaaaaa1111", "rla", 60_000), job("bbbbbbbb2222", "gdn", 60_000)
    progress.update(a, Status.RUNNING, 0)
    _feed(progress, clock, [a], 20, [1000], [0])
    progress.update(a, Status.FINISHED, 20_000)
    clock.t += 5.0
    progress.refresh()
    progress.update(b, Status.RUNNING, 0)
    _feed(progress, clock, [b], 9, [1000], [0])
    assert "tok/s" not in out.getvalue()
    # 20 s of a, 5 s with nothing running, then the tenth second of b: 30 s of running time.
    _feed(progress, clock, [b], 1, [1000], [9000])
    assert len([ln for ln in out.getvalue().splitlines() if "tok/s" in ln]) == 1


def test_table_has_rate_and_eta_columns():
    clock, out = Clock(), io.StringIO()
    progress = Progress("s", console=Console(file=out, width=200), interactive=False, clock=clock)
    a = job("aaaaaaaa1111", "rla", 60_000)
    progress.update(a, Status.RUNNING, 0)
    _feed(progress, clock, [a], 10, [2000], [0])
    Console(file=out, width=200).print(progress._table())
    text = out.getvalue()
    assert "tok/s" in text and "ETA" in text and "2k" in text and "20s" in text
    assert "sweep ETA ~20s" in text and "(estimate)" in text


def test_pending_jobs_count_in_the_sweep_eta_not_in_the_rate():
    clock = Clock()
    progress = Progress("s", console=Console(file=io.StringIO()), interactive=False, clock=clock)
    a, b = job("a" * 12, "a", 10_000), job("b" * 12, "b", 10_000)
    progress.update(b, Status.PENDING, 0)
    progress.update(a, Status.RUNNING, 0)
    _feed(progress, clock, [a], 5, [1000], [0])
    assert progress.sweep_rate() == pytest.approx(1000.0)
    assert progress.sweep_eta() == pytest.approx((5_000 + 10_000) / 1000.0)
    progress.update(a, Status.FAILED, 4_000)
    assert progress.sweep_rate() is None and progress.sweep_eta() is None


def test_jobs_too_short_for_a_rate_give_the_sweep_one_from_what_they_finished():
    """Jobs that end before their meter has two reports (CPU smoke jobs of a second or two) still give a sweep
    rate and ETA: the tokens of the jobs finished in this launch over the time since the first one started. A job
    resumed from 4,000 tokens counts only what it trained here."""
    clock = Clock()
    progress = Progress("s", console=Console(file=io.StringIO()), interactive=False, clock=clock)
    a, b, c = (job(x * 12, x, 10_000) for x in "abc")
    for j in (a, b, c):
        progress.update(j, Status.PENDING, 0)
    progress.update(b, Status.PENDING, 4_000)
    assert progress.sweep_rate() is None
    progress.update(a, Status.RUNNING, 0)
    progress.update(b, Status.RUNNING, 4_000)
    clock.t += 2
    progress.update(a, Status.FINISHED, 10_000)
    progress.update(b, Status.FINISHED, 10_000)
    assert progress.sweep_rate() == pytest.approx(16_000 / 2)
    assert progress.sweep_eta() == pytest.approx(10_000 / 8_000)
    assert "8k tok/s, sweep ETA ~1s" in progress.progress_line()
    progress.update(c, Status.RUNNING, 0)   # a running job's own rate, once it has one, is the sweep's
    _feed(progress, clock, [c], 5, [1000], [0])
    assert progress.sweep_rate() == pytest.approx(1000.0)


def test_line_mode_lists_no_job_an_earlier_launch_ended():
    """A relaunch lists finished jobs and queued ones silently; what this launch does to them prints."""
    clock, out = Clock(), io.StringIO()
    progress = Progress("s", console=Console(file=out, width=200), interactive=False, clock=clock)
    done, queued = job("aaaaaaaa1111", "rla/seed0", 4096), job("bbbbbbbb2222", "sgla/seed0", 4096)
    progress.update(done, Status.FINISHED, 4096)
    progress.update(queued, Status.PENDING, 0)
    assert out.getvalue() == ""
    progress.update(queued, Status.RUNNING, 0)
    progress.update(queued, Status.FINISHED, 4096)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "sgla/seed0 (bbbbbbbb): running" in lines[0] and "finished 4.1k/4.1k" in lines[1]
