"""`rla-sweep train`: one job from a preset, --set overrides with did-you-mean, --data forms, resume on rerun."""

from __future__ import annotations

import json

import pytest

from rla_ablate.cli import main
from rla_ablate.commands.train import build_job, data_config
from rla_ablate.errors import UserError
from rla_ablate.train import metric_series, read_jsonl

SMALL = ["model.vocab_size=257", "train.tokens=2048", "train.seq_len=64", "train.micro_batch_size=4",
         "train.batch_tokens=512", "train.cpu_threads=1", "eval.0.tokens=512"]


def test_set_reaches_every_section():
    job = build_job("tiny-rla", SMALL + ["model.fit=none", "train.lr=1e-3", "data.split=validation",
                                         "eval.0.data.split=train"], None, "cpu")
    assert job.model.fit == "none" and job.train.lr == 1e-3 and job.train.tokens == 2048
    assert job.data.kind == "stdlib" and job.data.split == "validation" and job.eval[0].data.split == "train"
    assert job.eval[0].tokens == 512
    recall = build_job("tiny-rla", SMALL + ["eval.1.name=mqar", "eval.1.data.kind=mqar", "eval.1.examples=16"],
                       None, "cpu")
    assert [(e.name, e.data.kind) for e in recall.eval] == [("val", "stdlib"), ("mqar", "mqar")]
    # The profile sits under --set: what --set leaves alone comes from it.
    assert job.train.min_lr == 3e-4 and job.train.resolved_warmup_tokens == 20
    paper = build_job("tiny-rla", [], None, "paper")
    assert paper.train.tokens == 50_000_000_000 and paper.train.batch_tokens == 2**22
    # a --set into the default eval set changes that job's copy, not the default of the next job
    assert paper.eval[0].data.split == "validation"


def test_an_eval_set_that_reads_the_training_text_is_refused(tmp_path):
    """An eval set's loss on documents the model trains on is a training loss under an eval set's name: refused with
    what to change (a text folder read whole by --data, the embedded corpus' same split, the same shards); a text
    folder's train and validation splits at one fraction are apart."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"doc{i}.txt").write_text(f"document {i} " * 40)
    held_out = f"eval.0={{name: mine, data: {{kind: text, path: {corpus}, split: validation, " \
               "validation_fraction: 0.2}, tokens: 512}"
    with pytest.raises(UserError) as err:
        build_job("tiny-rla", SMALL + [held_out], str(corpus), "cpu")
    assert "eval set 0 ('mine') reads text the model trains on" in str(err.value)
    assert err.value.key is None and str(err.value).startswith("--set: eval set 0")  # a check across sections
    assert "(data.split: train, data.validation_fraction: 0.2)" in str(err.value)
    job = build_job("tiny-rla", SMALL + [held_out, "data.split=train", "data.validation_fraction=0.2"], str(corpus),
                    "cpu")
    assert (job.data.split, job.eval[0].data.split) == ("train", "validation")
    with pytest.raises(UserError, match="the files between the two hash into both"):  # a wider held-out share
        build_job("tiny-rla", SMALL + [held_out.replace("0.2", "0.5"), "data.split=train",
                                       "data.validation_fraction=0.2"], str(corpus), "cpu")
    with pytest.raises(UserError, match="both read the embedded corpus' validation split; train on split: train "
                                        r"\(data.split: train\)"):
        build_job("tiny-rla", SMALL + ["data.split=validation"], None, "cpu")
    # one file of the folder trained on, the folder's validation split evaluated: refused where the file hashes there
    from rla_ablate.data.sources import path_fraction

    held = next(f"doc{i}.txt" for i in range(40) if path_fraction(f"doc{i}.txt") < 0.2)
    with pytest.raises(UserError, match=f"{corpus / held} lies in {corpus} and falls in its validation split"):
        build_job("tiny-rla", SMALL + [held_out], str(corpus / held), "cpu")
    kept = next(f"doc{i}.txt" for i in range(40) if path_fraction(f"doc{i}.txt") >= 0.2)
    assert build_job("tiny-rla", SMALL + [held_out], str(corpus / kept), "cpu").data.path == corpus / kept


@pytest.mark.parametrize("sets, words", [
    (["train.tokne=5"], "train.tokne: unknown key 'tokne' (did you mean 'tokens'?)"),
    (["trian.lr=1"], "unknown section 'trian' (did you mean 'train'?)"),
    (["model.fit=bogus"], "'bogus' is not allowed; allowed: residual, none, off"),
    (["eval.4.tokens=5"], "use an index 0..0, or 1 to add an entry"),
    (["train.tokens"], "expected KEY=VALUE"),
    (["eval.0={name: mq, data: {kind: mqar}, examples: 64"], "eval.0: the value '{name: mq, data: {kind: mqar}, "
                                                              "examples: 64' is not valid YAML at column 44"),
    (["train.betas=[0.9, 0.95"], "is not valid YAML at column 11: expected ',' or ']'"),
])
def test_bad_set_is_a_user_error(sets, words):
    with pytest.raises(UserError, match=None) as info:
        build_job("tiny-rla", sets, None, "cpu")
    assert words in str(info.value)


def test_data_forms(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("hello")
    assert data_config(None) == {"kind": "stdlib"} and data_config("mqar") == {"kind": "mqar"}
    assert data_config(str(tmp_path / "corpus")) == {"kind": "text", "path": str(tmp_path / "corpus")}
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "index.json").write_text("{}")
    assert data_config(str(tmp_path / "shards"))["kind"] == "shards"
    spec = tmp_path / "data.yaml"
    spec.write_text("kind: text\npath: corpus\nglb: '*.txt'\n")
    with pytest.raises(UserError, match="did you mean 'glob'"):
        build_job("tiny-rla", [], str(spec), "cpu")
    with pytest.raises(UserError, match="no such file"):
        data_config(str(tmp_path / "missing"))


def test_cli_trains_resumes_and_reports_errors(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "tiny-rla", "--out", str(out), "--profile", "cpu"] + [a for s in SMALL for a in ("--set", s)]
    assert main(argv) == 0
    losses = metric_series(read_jsonl(out / "metrics.jsonl"), "train/loss")
    assert [s for s, _ in losses] == [512, 1024, 1536, 2048]
    assert (out / "checkpoints").is_dir()
    assert json.loads((out / "job.json").read_text())["train"]["tokens"] == 2048
    err = capsys.readouterr().err
    assert "finished after 2,048 tokens" in err and "eval/val/loss" in err
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "already finished:" in err and "(2,048 tokens); its results follow" in err and "resuming" not in err
    # a torn newest checkpoint: the command names the one it resumes from, and the one it skips
    import shutil

    torn = tmp_path / "torn"
    shutil.copytree(out, torn)
    newest = sorted((torn / "checkpoints").glob("ckpt-*.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[:5000])
    assert main(["train", "tiny-rla", "--out", str(torn), "--profile", "cpu"]
                + [a for s in SMALL for a in ("--set", s)]) == 0
    err = capsys.readouterr().err.replace("\n", "")  # rich wraps at the test console's width
    assert f"skipping the unreadable newer {newest.name}" in err and "UserWarning" not in err, err
    # every checkpoint torn: said as the user's to fix, with exit 2 and no traceback, before training
    for ckpt in (torn / "checkpoints").glob("ckpt-*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:100])
    assert main(["train", "tiny-rla", "--out", str(torn), "--profile", "cpu"]
                + [a for s in SMALL for a in ("--set", s)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no checkpoint in {torn / 'checkpoints'} is whole (2 files" in err and "Traceback" not in err, err
    assert f"move {torn / 'checkpoints'} and {torn / 'metrics.jsonl'} away" in err, err
    # more tokens into the same folder: another job, refused before anything is written, naming what differs
    record = (out / "job.json").read_bytes()
    assert main(argv + ["--set", "train.tokens=4096"]) == 2
    err = capsys.readouterr().err
    assert "holds checkpoints of a different job configuration: train.tokens (4096 now, 2048 before)" in err
    assert "resuming from" not in err and (out / "job.json").read_bytes() == record
    # its checkpoints deleted (to save disk): the finished record is kept, not trained over, for this job or another
    gone = tmp_path / "gone"
    shutil.copytree(out, gone)
    shutil.rmtree(gone / "checkpoints")
    kept = (gone / "metrics.jsonl").read_bytes(), (gone / "job.json").read_bytes()
    gone_argv = ["train", "tiny-rla", "--out", str(gone), "--profile", "cpu"] + [a for s in SMALL for a in ("--set", s)]
    assert main(gone_argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a finished run (metrics.jsonl) whose checkpoints are gone" in err and "move" in err, err
    assert main(gone_argv + ["--set", "train.tokens=4096"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a finished run (metrics.jsonl) whose checkpoints are gone" in err, err
    # a run stopped before it finished, with metrics and no checkpoint: another job is refused, naming what differs
    lines = (gone / "metrics.jsonl").read_text().splitlines()
    (gone / "metrics.jsonl").write_text("\n".join(r for r in lines if '"type": "close"' not in r) + "\n")
    assert main(gone_argv + ["--set", "train.tokens=4096"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds the metrics of a run (metrics.jsonl) of a different job configuration: train.tokens" in err, err
    assert (gone / "job.json").read_bytes() == kept[1]
    # metrics without the job.json that says whose they are (copied in by hand): kept, not trained over
    (gone / "job.json").unlink()
    records = (gone / "metrics.jsonl").read_bytes()
    assert main(gone_argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds the metrics of a run (metrics.jsonl) and no readable job.json recording its job" in err, err
    assert (gone / "metrics.jsonl").read_bytes() == records and not (gone / "job.json").exists()
    assert main(["train", "tiny-rla", "--out", str(out), "--set", "train.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert "--set: train.lr:" in err and "Traceback" not in err
    # --data replaces the training data only: the header says which data the eval set reads, and a note says
    # how to evaluate on the training data's kind (the command it gives parses)
    mqar = ["train", "tiny-rla", "--out", str(tmp_path / "mqar"), "--profile", "cpu", "--data", "mqar",
            "--set", "model.vocab_size=8192", "--set", "train.tokens=1024", "--set", "train.batch_tokens=512",
            "--set", "train.micro_batch_size=4"]
    assert main(mqar) == 0
    err = capsys.readouterr().err
    assert "data mqar; eval val (stdlib)" in " ".join(err.split()) and "note: the eval set(s) read other data" in err
    assert main(mqar + ["--set", "eval.0={name: mqar, data: {kind: mqar, seed: 1}, examples: 64}",
                        "--out", str(tmp_path / "mqar2")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "data mqar; eval mqar (mqar)" in err and "note:" not in err
    # eval sets the user chose by --set, of another kind than training's: no note suggesting that --set
    assert main(mqar + ["--set", "eval.0={name: val, data: {kind: stdlib, split: validation}, tokens: 256}",
                        "--out", str(tmp_path / "mqar3")]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "other"), "--profile", "cpu",
                 "--set", "model.vocab_size=256"]) == 2
    assert "model.vocab_size=257" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_before_the_folder_is_made(tmp_path, capsys):
    sets = [arg for kv in SMALL + ["train.device=cuda"] for arg in ("--set", kv)]
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "o"), *sets]) == 2
    assert "train.device: device cuda asked for but CUDA is not available here" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # CUDA graphs need CUDA too, with device auto; on the CPU, with what a graph cannot replay
    sets = [arg for kv in SMALL + ["train.cuda_graphs=true"] for arg in ("--set", kv)]
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "o"), *sets]) == 2
    assert "train.cuda_graphs: cuda_graphs asked for but CUDA is not available here; allowed here: false" in \
        capsys.readouterr().err
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "o"), *sets, "--set", "train.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert "cuda_graphs cannot run with device cpu" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_data_found_wrong_once_read_is_said_at_its_key_in_the_job(tmp_path, capsys):
    """A problem the data shows only when it is read (a file not UTF-8) is said at the key --set writes: data.glob
    for the training data, eval.N.data.glob for an eval set's; the folder made for the job is removed."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.txt").write_bytes(b"\xff\xfe not utf-8")
    sets = [arg for kv in SMALL for arg in ("--set", kv)]
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "o"), *sets, "--data", str(bad)]) == 2
    assert f"data.glob: {bad / 'a.txt'} is not UTF-8 text" in capsys.readouterr().err
    held = f"eval.0={{name: v, data: {{kind: text, path: {bad}}}, tokens: 64}}"
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "o"), *sets, "--set", held]) == 2
    assert f"error: eval.0.data.glob: {bad / 'a.txt'} is not UTF-8 text" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_vocabulary_too_small_for_the_data_names_the_data_and_the_fix(tmp_path, capsys):
    """--data mqar on a byte-level preset: the message names what needs the larger vocabulary and how to set it,
    before the job's folder is made."""
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "mq"), "--data", "mqar"]) == 2
    err = capsys.readouterr().err
    assert ("model.vocab_size: the model's vocab_size is 257 but the training data (mqar) needs 8192 token ids; set "
            "model.vocab_size=8192 (--set model.vocab_size=8192)") in err, err
    assert not (tmp_path / "mq").exists()


def test_sigterm_stops_train_after_a_step_with_a_checkpoint(tmp_path, capsys):
    """A scheduler's preemption (SIGTERM) stops `rla-sweep train` as Ctrl-C does: a checkpoint at the end of the
    step, the rerun hint, exit 143; before, the process died with everything since its last checkpoint. While it
    trains, another `train` into its folder is refused (two would write one job.json, metrics and checkpoints)."""
    import signal
    import subprocess
    import sys
    import time

    from cli_run import REPO

    out = tmp_path / "run"
    sets = [s for s in SMALL if not s.startswith("train.tokens")] + ["train.tokens=4194304"]
    proc = subprocess.Popen([sys.executable, "-m", "rla_ablate.cli", "train", "tiny-rla", "--out", str(out),
                             "--profile", "cpu"] + [a for s in sets for a in ("--set", s)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and '"train/loss"' in metrics.read_text()):  # a step is done: the loop runs
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    # a second training into the folder while this one runs is refused, and leaves the folder as it is
    record = (out / "job.json").read_bytes()
    assert main(["train", "tiny-gdn", "--out", str(out), "--profile", "cpu"] + [a for s in sets for a in ("--set", s)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"another `rla-sweep train` (pid {proc.pid}) is training in {out}" in err and "Traceback" not in err, err
    assert (out / "job.json").read_bytes() == record
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr
    assert "SIGTERM: stopping after this step (checkpoint)" in stderr and "rerun the same command" in stderr
    assert list((out / "checkpoints").glob("ckpt-*.pt")), "no checkpoint"


def test_configuration_differences_count_the_entries_of_a_list_that_changed_length():
    """A job whose eval list grew from none to one entry: "eval (1 entry now, none before)", not the entry's keys
    one by one with "(unset)" on the side that has them."""
    import json

    from rla_ablate.train.job import identity_differences

    now = {"train": {"tokens": 8192}, "eval": [{"name": "v", "data": {"kind": "text", "eos_token": None}}]}
    before = {"train": {"tokens": 4096}, "eval": []}
    assert identity_differences(json.dumps(now), json.dumps(before)) == (
        "eval (1 entry now, none before), train.tokens (8192 now, 4096 before)")
    now["eval"].append(dict(now["eval"][0], name="w"))
    before["eval"] = [dict(now["eval"][0], name="x")]
    assert identity_differences(json.dumps(now), json.dumps(before)).startswith("eval (2 entries now, 1 entry before)")
    before["eval"].append(now["eval"][1])
    assert identity_differences(json.dumps(now), json.dumps(before)).startswith('eval.0.name ("v" now, "x" before)')


def test_a_model_key_the_data_refuses_is_named_at_its_line_of_the_model_file(tmp_path, capsys):
    """`train my-model.yaml` whose vocab_size the data outgrows: the file, line and key (it was only
    `model.vocab_size:`), unless --set gave that key; nothing is left behind."""
    from rla_ablate.cli import main
    from rla_ablate.models.presets import preset_path

    text = preset_path("tiny-rla").read_text().replace("vocab_size: 257", "vocab_size: 100")
    assert "vocab_size: 100" in text
    model = tmp_path / "m.yaml"
    model.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("vocab_size:"))
    out = tmp_path / "job"
    assert main(["train", str(model), "--out", str(out), *[f"--set={s}" for s in SMALL if "vocab" not in s]]) == 2
    err = capsys.readouterr().err
    assert f"{model}:{line}: vocab_size: the model's vocab_size is 100 but the training data (stdlib) needs 257" in err
    assert not out.exists()


def test_data_of_fewer_token_ids_than_the_model_is_noted(tmp_path, capsys):
    """--data whose tokens take fewer ids than the preset's vocabulary: a note with the unused rows and the --set
    that fits the model (the run goes on)."""
    from rla_ablate.cli import main

    sets = [f"--set={s}" for s in SMALL] + ["--set=data.vocab_size=64", "--set=data.num_kv_pairs=4",
                                            "--set=eval.0={name: mqar, data: {kind: mqar, vocab_size: 64, "
                                            "num_kv_pairs: 4}, examples: 8}"]
    assert main(["train", "tiny-rla", "--out", str(tmp_path / "job"), "--data", "mqar", *sets]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("note: the data's tokens take 64 ids and the model's vocab_size is 257: 193 embedding rows go unused "
            "(--set model.vocab_size=64 fits the model to the data)") in err, err


def test_a_data_file_with_other_sections_and_an_empty_split_say_what_to_do(tmp_path, capsys):
    """A --data YAML holding eval sets beside its data is refused at their line (they were dropped without a word);
    a train split no file of the folder falls in says to lower validation_fraction (raising it empties it more)."""
    spec = tmp_path / "job.yaml"
    spec.write_text("data: {kind: stdlib}\neval:\n  - {name: val, data: {kind: stdlib, split: validation}}\n")
    with pytest.raises(UserError, match=r"job.yaml:2: eval: holds eval beside data: --data reads a data config "
                                        "alone"):
        build_job("tiny-rla", SMALL, str(spec), "cpu")
    from rla_ablate.data import TextData
    from rla_ablate.data.sources import iter_documents, path_fraction

    folder = tmp_path / "one"
    folder.mkdir()
    name = next(f"d{i}.txt" for i in range(200) if path_fraction(f"d{i}.txt") < 0.5)
    (folder / name).write_text("text")
    with pytest.raises(UserError, match="falls in the train split .*; lower validation_fraction or add files"):
        list(iter_documents(TextData(path=folder, split="train", validation_fraction=0.5)))
    with pytest.raises(UserError, match="falls in the validation split .*; raise validation_fraction or add files"):
        list(iter_documents(TextData(path=folder, split="validation", validation_fraction=0.001)))
