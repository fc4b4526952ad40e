"""The training loop end to end on the CPU-tiny RLA preset: golden loss curve, bit-exact resume in a new
process after a crash, the divergence guard with injected NaNs, cancellation and idempotent reruns.

Regenerate the golden curve (after a deliberate change to the numbers) with
    python tests/test_train_loop.py --regenerate
"""

from __future__ import annotations

import json
import math
import pickle
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rla_ablate.errors import UserError
from rla_ablate.models import flops_per_token, load_preset
from rla_ablate.train import JobConfig, TrainConfig, metric_series, read_jsonl, run_job
from rla_ablate.train.checkpoint import list_checkpoints, load_checkpoint

GOLDEN = Path(__file__).parent / "assets" / "losses" / "tiny-rla.json"
REPO = Path(__file__).resolve().parents[1]


def tiny_job(model: dict | None = None, **train) -> JobConfig:
    """24 steps of 512 tokens (2 micro batches of 4 x 64), evals every 4 steps, checkpoints every 3; `model`
    changes the preset's fields."""
    settings = dict(tokens=12288, seq_len=64, micro_batch_size=4, batch_tokens=512, lr=3e-3, min_lr=3e-4,
                    warmup_tokens=1024, eval_every_tokens=2048, checkpoint_every_tokens=1536, keep_checkpoints=3,
                    cpu_threads=1, seed=0)
    settings.update(train)
    return JobConfig.model_validate({
        "model": load_preset("tiny-rla").replace(vocab_size=257, **(model or {})).model_dump(),
        "train": TrainConfig(**settings).model_dump(exclude_unset=True),
        "data": {"kind": "stdlib"},
        "eval": [{"name": "val", "data": {"kind": "stdlib", "split": "validation"}, "tokens": 1024}],
    })


def curves(out: Path) -> dict[str, list]:
    records = read_jsonl(out / "metrics.jsonl")
    return {key: metric_series(records, key) for key in ("train/loss", "train/grad_norm", "train/lr", "eval/val/loss",
                                                          "eval/val/acc_area")}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    result = run_job(tiny_job(), out)
    assert result.status == "finished", result.error
    return out, result


def test_finishes_with_every_metric(straight):
    out, result = straight
    assert result.tokens_done == 12288 and result.error is None
    records = read_jsonl(out / "metrics.jsonl")
    keys = set().union(*(r["values"] for r in records if r["type"] == "metrics"))
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/skipped_steps",
                "eval/val/loss", "eval/val/ppl", "eval/val/acc", "layer_00/attn_out_norm", "layer_01/S_norm",
                "layer_01/R_norm"):
        assert key in keys, key
    # MFU needs a device peak: none is known for a CPU.
    assert "train/mfu" not in keys
    # What a search may optimize is what the trainer logs: every train/ and eval/ key, and on a CPU all but the
    # GPU-only two.
    logged = {k for k in keys if k.startswith(("train/", "eval/"))}
    assert logged == set(tiny_job().logged_metrics()) - {"train/mfu", "train/peak_mem_gib"}
    events = {r["name"]: r for r in records if r["type"] == "event"}
    assert events["info"]["detail"]["backend"] == "chunk"
    assert events["info"]["detail"]["glue"] == "torch"  # FLA's fused glue runs on CUDA only
    assert events["start"]["detail"]["tokens_total"] == 12288
    assert records[-1] == {**records[-1], "type": "close", "status": "finished"}
    c = curves(out)
    assert [s for s, _ in c["train/loss"]] == list(range(512, 12289, 512))
    assert [s for s, _ in c["eval/val/loss"]] == list(range(2048, 12289, 2048))
    assert c["train/loss"][-1][1] < c["train/loss"][0][1] - 0.5
    assert c["train/lr"][-1][1] == pytest.approx(3e-4)
    assert result.metrics["eval/val/ppl"] == pytest.approx(math.exp(result.metrics["eval/val/loss"]))
    # the area under the accuracy curve so far: each evaluation's accuracy weighted by the tokens since the one before
    acc = metric_series(read_jsonl(out / "metrics.jsonl"), "eval/val/acc")
    area, before = 0.0, 0
    for (t, a), (t_area, got) in zip(acc, c["eval/val/acc_area"], strict=True):
        area, before = area + a * (t - before), t
        assert t_area == t and got == pytest.approx(area / t, rel=1e-12)
    assert min(a for _, a in acc) < result.metrics["eval/val/acc_area"] < max(a for _, a in acc)
    assert [t for t, _ in list_checkpoints(out)] == [9216, 10752, 12288]


def cpu_fingerprint() -> str:
    """What decides torch's CPU kernel paths: architecture, vector ISA torch dispatches to, and the CPU model, by its
    name and by its family, model and stepping numbers (a virtual machine may name every EPYC alike, and two EPYC
    generations with AVX512 sum in other orders)."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        fields: dict[str, str] = {}
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        model = fields.get("model name", "")
        if "cpu family" in fields:
            model += f" (family {fields['cpu family']}, model {fields.get('model')}, stepping {fields.get('stepping')})"
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} {model}".strip()


def test_golden_loss_curve(straight):
    out, _ = straight
    golden = json.loads(GOLDEN.read_text())
    assert golden["job"] == tiny_job().canonical_json(), "the golden job changed: regenerate (see module docstring)"
    got = curves(out)
    hint = (f"loss curve differs from {GOLDEN} (torch {torch.__version__} on {cpu_fingerprint()!r}, golden from torch "
            f"{golden['torch']} on {golden.get('cpu')!r}); if the change is intended: "
            "python tests/test_train_loop.py --regenerate")
    want = {name: [tuple(x) for x in golden[name]] for name in ("train/loss", "eval/val/loss")}
    if golden.get("cpu") == cpu_fingerprint() and golden["torch"] == torch.__version__:
        # Exact: same code, same torch, same CPU kernels, one thread. A mismatch is a change in the numbers.
        assert got["train/loss"] == want["train/loss"], hint
        assert got["eval/val/loss"] == want["eval/val/loss"], hint
    else:
        # Another CPU (or torch) sums in another order: the same curve to float32 rounding, compounded over 24 steps.
        for name in want:
            assert [t for t, _ in got[name]] == [t for t, _ in want[name]], hint
            assert [v for _, v in got[name]] == pytest.approx([v for _, v in want[name]], rel=1e-5), hint


_CHILD = """
import os, pickle, sys
from rla_ablate.train import run_job
job = pickle.load(open(sys.argv[1], "rb"))
calls = {"n": 0}
def crash_before(step):
    def should_stop():
        calls["n"] += 1
        if calls["n"] == step:
            os._exit(17)   # a hard crash: no checkpoint, no close record
        return False
    return should_stop
kill_at = int(sys.argv[3])
result = run_job(job, sys.argv[2], should_stop=crash_before(kill_at) if kill_at else None)
print(result.status, result.tokens_done)
"""


def _child(job_file: Path, out: Path, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD, str(job_file), str(out), str(kill_at)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


# The proxies' relative clip: its radius is the running residual RMS the trainer hands over once per step, which
# a resumed process must rebuild from the checkpoint's buffers.
RELATIVE_CLIP = {"clip_mode": "relative", "clip": 2.0}


@pytest.fixture(scope="module")
def straight_relative(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight-relative")
    result = run_job(tiny_job(RELATIVE_CLIP), out)
    assert result.status == "finished", result.error
    return out, result


@pytest.mark.parametrize("model", [None, RELATIVE_CLIP], ids=["absolute-clip", "relative-clip"])
def test_resume_in_a_new_process_is_bit_exact(model, request, tmp_path):
    ref_out, _ = request.getfixturevalue("straight" if model is None else "straight_relative")
    job_file = tmp_path / "job.pkl"
    job_file.write_bytes(pickle.dumps(tiny_job(model)))
    out = tmp_path / "run"
    # Crash before step 9: the checkpoint at step 6 survives, steps 7-8 were logged and must be rewritten.
    crashed = _child(job_file, out, kill_at=9)
    assert crashed.returncode == 17, crashed.stderr
    assert [t for t, _ in list_checkpoints(out)] == [1536, 3072]
    assert max(s for s, _ in curves(out)["train/loss"]) == 4096
    resumed = _child(job_file, out, kill_at=0)
    assert resumed.returncode == 0 and resumed.stdout.split() == ["finished", "12288"], resumed.stderr
    assert curves(out) == curves(ref_out)
    records = read_jsonl(out / "metrics.jsonl")
    assert [(r["name"], r["step"]) for r in records if r["type"] == "event" and r["name"] == "resumed"] == [
        ("resumed", 3072)]
    assert sum(r["type"] == "close" for r in records) == 1
    ref, got = (load_checkpoint(list_checkpoints(d)[-1][1]) for d in (ref_out, out))
    assert ref["model"].keys() == got["model"].keys()
    for name, tensor in ref["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for pid, state in ref["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, got["optimizer"]["state"][pid][key]), (pid, key)
    assert ref["data"] == got["data"]


@pytest.mark.parametrize("log", ["kept", "lost"])
def test_resume_from_a_checkpoint_without_curves(log, straight, tmp_path):
    """A checkpoint of an earlier version holds no accuracy-curve area: the resumed run sums the evaluations in its
    metrics.jsonl and logs the uninterrupted run's areas; with that log gone it logs no area (and keeps none from
    the checkpoint as a final value) rather than one that misses the evaluations before the checkpoint."""
    ref_out, ref = straight
    job_file = tmp_path / "job.pkl"
    job_file.write_bytes(pickle.dumps(tiny_job()))
    out = tmp_path / "run"
    assert _child(job_file, out, kill_at=9).returncode == 17
    tokens, path = list_checkpoints(out)[-1]
    state = load_checkpoint(path)
    assert tokens == 3072 and state["curves"]["tokens"] == 2048
    del state["curves"]
    torch.save(state, path)
    if log == "lost":
        (out / "metrics.jsonl").unlink()
    resumed = _child(job_file, out, kill_at=0)
    assert resumed.returncode == 0, resumed.stderr
    area = curves(out)["eval/val/acc_area"]
    if log == "kept":
        assert area == curves(ref_out)["eval/val/acc_area"]
    else:
        assert area == []
        last = load_checkpoint(list_checkpoints(out)[-1][1])
        assert "eval/val/acc_area" not in last["metrics"] and "eval/val/acc" in last["metrics"]
        assert last["curves"]["known"] is False  # and a later resume does not start the area from zero


def test_an_unknown_area_stays_unknown_through_later_resumes():
    from rla_ablate.train.loop import _Curves

    lost = _Curves()
    lost.rebuild([], 3072, {"eval/val/acc": 0.25, "eval/val/acc_area": 0.2})
    assert not lost.known and lost.add({"eval/val/acc": 0.5}, 4096) == {}
    again = _Curves()
    again.load_state_dict(lost.state_dict())
    assert not again.known and again.add({"eval/val/acc": 0.5}, 6144) == {}
    old = _Curves()
    old.load_state_dict({"area": {"eval/val/acc": 512.0}, "tokens": 2048})  # a state without the flag
    assert old.add({"eval/val/acc": 0.5}, 4096) == {"eval/val/acc_area": (512.0 + 1024.0) / 4096}


def test_finished_job_reruns_as_a_no_op(straight):
    out, first = straight
    size = (out / "metrics.jsonl").stat().st_size
    again = run_job(tiny_job(), out)
    assert (again.status, again.tokens_done, again.metrics) == ("finished", 12288, first.metrics)
    assert (out / "metrics.jsonl").stat().st_size == size


def test_a_different_config_does_not_resume_a_folder(straight):
    out, _ = straight
    with pytest.raises(UserError, match=r"different job configuration: train.lr \(0.001 now, 0.003 before\)"):
        run_job(tiny_job(lr=1e-3), out)


def test_cancel_checkpoints_and_resume_finishes(tmp_path):
    job = tiny_job(tokens=2048, eval_every_tokens=None, checkpoint_every_tokens=None, peak_flops=1e11)
    calls = {"n": 0}

    def stop_before_third_step():
        calls["n"] += 1
        return calls["n"] == 3

    cancelled = run_job(job, tmp_path, should_stop=stop_before_third_step)
    assert (cancelled.status, cancelled.tokens_done) == ("cancelled", 1024)
    assert cancelled.error == "cancelled at 1,024 tokens"
    assert [t for t, _ in list_checkpoints(tmp_path)][-1] == 1024
    done = run_job(job, tmp_path)
    assert (done.status, done.tokens_done) == ("finished", 2048)
    # MFU = training FLOPs per token x tokens/s over the device peak.
    m = done.metrics
    assert m["train/mfu"] == pytest.approx(flops_per_token(job.model, 64) * m["train/tokens_per_s"] / 1e11)


def test_a_cancel_right_after_a_checkpoint_does_not_write_it_again(tmp_path):
    """A stop at the step after a regular checkpoint (a closed progress pipe stops at the next print) finds the state
    saved already: one checkpoint event at those tokens, not two (at 1.5B each is gigabytes)."""
    job = tiny_job(tokens=2048, eval_every_tokens=None, checkpoint_every_tokens=1024)
    calls = {"n": 0}

    def stop_after_the_checkpoint():
        calls["n"] += 1
        return calls["n"] == 3   # steps of 512 tokens: the checkpoint at 1024 is step 2's

    cancelled = run_job(job, tmp_path, should_stop=stop_after_the_checkpoint)
    assert (cancelled.status, cancelled.tokens_done) == ("cancelled", 1024)
    saves = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("name") == "checkpoint"]
    assert saves == [1024]
    # a stop at once after a resume finds its state in the checkpoint it resumed from
    calls["n"] = 0
    again = run_job(job, tmp_path, should_stop=lambda: True)
    assert (again.status, again.tokens_done) == ("cancelled", 1024)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("name") == "checkpoint"] == [1024]
    assert run_job(job, tmp_path).status == "finished"


def test_vocab_too_small_for_the_data_is_a_user_error(tmp_path):
    job = tiny_job()
    job = job.model_copy(update={"model": job.model.replace(vocab_size=256)})
    with pytest.raises(UserError, match="model.vocab_size=257"):
        run_job(job, tmp_path)


def test_a_crash_while_building_is_a_failed_result_that_keeps_the_log(tmp_path, monkeypatch):
    import rla_ablate.train.loop as loop

    job = tiny_job(tokens=2048, eval_every_tokens=None, checkpoint_every_tokens=None)
    assert run_job(job, tmp_path, should_stop=lambda: True).status == "cancelled"
    before = read_jsonl(tmp_path / "metrics.jsonl")

    def broken(cfg):
        raise RuntimeError("out of memory while building")

    monkeypatch.setattr(loop, "build_model", broken)
    result = run_job(job, tmp_path)
    assert result.status == "failed" and "out of memory while building" in result.error
    after = read_jsonl(tmp_path / "metrics.jsonl")
    assert after[: len(before)] == before and after[-1]["status"] == "failed"


class _NaNInjector:
    """Wraps the real model: NaN logits on chosen forward calls, NaN gradients on chosen backward calls."""

    def __init__(self, nan_loss_steps, nan_grad_steps, micro_batches):
        self.nan_loss_steps, self.nan_grad_steps, self.micro = set(nan_loss_steps), set(nan_grad_steps), micro_batches
        self.forwards = 0

    def build(self, real_build):
        def build(cfg):
            model = real_build(cfg)

            def forward_hook(module, args, logits):
                step = self.forwards // self.micro + 1
                self.forwards += 1 if module.training else 0
                if module.training and step in self.nan_loss_steps:
                    return logits * float("nan")
                if module.training and step in self.nan_grad_steps:
                    logits.register_hook(lambda grad: grad * float("inf"))
                return logits

            model.register_forward_hook(forward_hook)
            return model

        return build


def test_divergence_guard_skips_then_fails_with_the_reason(tmp_path, monkeypatch):
    import rla_ablate.train.loop as loop

    injector = _NaNInjector(nan_loss_steps={3, 7, 8}, nan_grad_steps={5}, micro_batches=2)
    monkeypatch.setattr(loop, "build_model", injector.build(loop.build_model))
    result = run_job(tiny_job(max_skipped_steps=3), tmp_path)
    # Steps 3 (NaN loss) and 5 (Inf gradient) and 7 are skipped; the fourth skip, step 8, exceeds the limit.
    assert (result.status, result.error, result.tokens_done) == ("diverged", "diverged at 4096 tokens", 4096)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    skipped = [(r["step"], r["detail"]["skipped"]) for r in records if r.get("name") == "skipped_step"]
    assert skipped == [(1536, 1), (2560, 2), (3584, 3), (4096, 4)]
    grad_skip = next(r for r in records if r.get("name") == "skipped_step" and r["step"] == 2560)
    # JSON has no NaN or Inf: the log writes them as strings.
    assert math.isfinite(grad_skip["detail"]["loss"]) and not math.isfinite(float(grad_skip["detail"]["grad_norm"]))
    assert records[-1]["status"] == "diverged" and records[-1]["reason"] == "diverged at 4096 tokens"
    # Skipped steps never reach the logged loss; the surviving steps still train.
    losses = metric_series(records, "train/loss")
    assert all(math.isfinite(v) for _, v in losses)
    assert [s for s, _ in losses] == [512, 1024, 2048, 3072]
    assert result.metrics["train/skipped_steps"] == 4.0


def regenerate() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run_job(tiny_job(), tmp)
        assert result.status == "finished", result.error
        got = curves(Path(tmp))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({"job": tiny_job().canonical_json(), "torch": torch.__version__, "cpu": cpu_fingerprint(),
                                  "train/loss": got["train/loss"], "eval/val/loss": got["eval/val/loss"]},
                                 indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(got['train/loss'])} losses, last {got['train/loss'][-1][1]:.6f}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python tests/test_train_loop.py --regenerate")
    regenerate()


def test_a_skipped_step_on_a_log_boundary_logs_the_count_once(tmp_path, monkeypatch):
    import rla_ablate.train.loop as loop

    # Step 4 (a log boundary with log_every_tokens 1024) is skipped while step 3 is in the window.
    injector = _NaNInjector(nan_loss_steps={4}, nan_grad_steps=set(), micro_batches=2)
    monkeypatch.setattr(loop, "build_model", injector.build(loop.build_model))
    result = run_job(tiny_job(tokens=4096, log_every_tokens=1024), tmp_path)
    assert result.status == "finished", result.error
    seen = [(key, r["step"]) for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("type") == "metrics"
            for key in r["values"]]
    assert len(seen) == len(set(seen)), sorted(k for k in seen if seen.count(k) > 1)
    assert ("train/skipped_steps", 2048) in seen


def test_a_logger_with_progress_gets_the_tokens_after_every_step(tmp_path):
    """A sweep's live rate and ETA move between metric logs: the loop hands a logger that has `tokens_trained` the
    tokens after each step (here 8 steps of 512)."""
    from rla_ablate.train import NullLogger

    class Progress(NullLogger):
        def __init__(self):
            self.tokens: list[int] = []

        def tokens_trained(self, tokens: int) -> None:
            self.tokens.append(tokens)

    seen = Progress()
    assert run_job(tiny_job(tokens=4096, log_every_tokens=2048), tmp_path / "run", seen).status == "finished"
    assert seen.tokens == [512 * i for i in range(1, 9)]
