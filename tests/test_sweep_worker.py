"""A job's reports to the launch's monitor (rla_ablate.sweep.worker.SweepLogger) on a real local Ray instance: they
never block the job, so `cpus:` bounds how many jobs run at once even when the monitor answers slowly, and a stop
the monitor answers reaches the job."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_run import REPO

pytestmark = pytest.mark.slow

SCRIPT = r'''
import json, sys, time
from pathlib import Path
import ray

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

@ray.remote(num_cpus=0)
class SlowMonitor:
    """Answers each report after 0.5 s; says stop once `stop_after` reports of a job came in (0: never)."""
    def __init__(self, stop_after):
        self.stop_after, self.seen, self.values = stop_after, {}, {}
    def report(self, job_id, tokens, values):
        time.sleep(0.5)
        self.seen[job_id] = self.seen.get(job_id, 0) + 1
        self.values.setdefault(job_id, []).extend(values)
        return bool(self.stop_after) and self.seen[job_id] >= self.stop_after
    def reported(self):
        return self.values

@ray.remote(num_cpus=1, max_retries=0)
def job(monitor, i, out, seconds):
    from rla_ablate.sweep.worker import SweepLogger
    log = SweepLogger(None, monitor, f"job{i}", Path(out), watch="eval/val/loss")
    start, step, stopped = time.time(), 0, None
    while time.time() - start < seconds:
        if log.should_stop():
            stopped = time.time() - start
            break
        step += 1
        log.log({"eval/val/loss": float(step)}, step)   # a watched value: each one forces a report
        time.sleep(0.05)
    log.close("finished")
    return start, time.time(), stopped, step

out = sys.argv[1]
monitor = SlowMonitor.remote(0)
spans = ray.get([job.remote(monitor, i, out, 3.0) for i in range(4)])
edges = sorted([(a, 1) for a, b, _, _ in spans] + [(b, -1) for a, b, _, _ in spans])
now = most = 0
for _, d in edges:
    now += d
    most = max(most, now)
values = ray.get(monitor.reported.remote())
steps = {f"job{i}": s for i, (_, _, _, s) in enumerate(spans)}
stopper = SlowMonitor.remote(2)
_, _, stopped, _ = ray.get(job.remote(stopper, 9, out, 30.0))
print(json.dumps({"most": most, "complete": all([v for v, _ in values[j]] == list(range(1, steps[j] + 1))
                                                 for j in steps), "stopped": stopped}))
ray.shutdown()
'''


def test_reports_never_block_a_job_and_a_stop_reaches_it(tmp_path):
    """Four jobs of one CPU each on two CPUs, reporting every watched value to a monitor that takes 0.5 s a reply:
    at most two ever run at once (a task that waited on the reply, in ray.get or in ray.wait, lent its CPU to a
    third); every watched value reaches the monitor once, in order; a stop the monitor answers stops the job."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["most"] <= 2, got
    assert got["complete"], got
    assert got["stopped"] is not None and got["stopped"] < 5.0, got


def test_a_jobs_report_carries_the_tokens_of_its_last_step_not_of_its_last_log(tmp_path):
    """`SweepLogger.tokens_trained` (called by the loop after each step) sets the tokens the next report sends, so the
    launch's rate moves between metric logs. A recording stand-in for the Ray monitor."""
    from concurrent.futures import Future
    from pathlib import Path

    from rla_ablate.sweep.worker import SweepLogger

    sent = []

    class Reply:
        def __init__(self, tokens):
            sent.append(tokens)

        def future(self):
            done = Future()
            done.set_result(False)
            return done

    class Monitor:
        class report:
            @staticmethod
            def remote(job_id, tokens, values):
                return Reply(tokens)

    log = SweepLogger(None, Monitor(), "job1", Path(tmp_path))
    log.log({"train/loss": 3.0}, 2048)
    log.tokens_trained(2560)
    log.tokens_trained(3072)
    log._last_report = 0.0  # the rate limit (REPORT_EVERY_S) passed
    assert log.should_stop() is False
    assert sent[-1] == 3072, sent
    log.tokens_trained(1024)  # never backwards (a resumed attempt reports from its checkpoint through `start`)
    assert log.tokens == 3072


def test_a_jobs_project_warnings_reach_the_launch_as_notes(monkeypatch):
    """`execute` sends the project's warnings (errors.Notice: a damaged metrics.jsonl line that a resume moves aside)
    to the monitor as the job's notes, which the launch prints and keeps in the job's status; the worker's own stderr
    reaches no one. Other warnings are shown as Python shows them."""
    import warnings

    from rla_ablate.errors import Notice
    from rla_ablate.sweep import worker

    sent = []

    class Note:
        def remote(self, job_id, text, keep=True):
            sent.append((job_id, text, keep))

    monitor = type("Monitor", (), {"note": Note()})()

    def job(*args):
        # said by the job's own `resumed` event: not twice
        warnings.warn("skipped unreadable checkpoints: ckpt-1.pt: torn", Notice, stacklevel=2)
        warnings.warn("metrics.jsonl: line 2 is not a metrics record: moved to metrics.jsonl.damaged", Notice,
                      stacklevel=2)
        warnings.warn("a library's own warning", UserWarning, stacklevel=2)
        return "outcome"

    monkeypatch.setattr(worker, "_execute", job)
    with pytest.warns(UserWarning, match="a library's own warning"):
        assert worker.execute(None, "out", "job1", None, None, monitor, 1.0) == "outcome"
    assert sent == [("job1", "warning: metrics.jsonl: line 2 is not a metrics record: moved to metrics.jsonl.damaged",
                     True)]
