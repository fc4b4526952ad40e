"""What `rla-sweep status` and `cancel` read and write: the sweep folder, never a live process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rla_ablate.errors import UserError
from rla_ablate.fileio import shell_arg
from rla_ablate.outcome import ACTIVE, Cause, Status
from rla_ablate.sweep.state import SweepDir
from rla_ablate.train.checkpoint import is_whole, list_checkpoints

INTERRUPTED = "the launch stopped before this job ended; `rla-sweep resume {name} --root {root}` {how}"


def resume_tokens(sdir: SweepDir, job_id: str) -> int:
    """The tokens an unfinished job starts again from: its newest checkpoint's, or 0 (none written, or none came
    along when the sweep folder was copied). Its last progress report may be ahead of that, or behind."""
    # the newest whole one: a resume skips a torn file (a bad copy, a full disk) for the one before it
    whole = [tokens for tokens, path in list_checkpoints(sdir.job_dir(job_id)) if is_whole(path)]
    return int(whole[-1]) if whole else 0


def starts_from(sdir: SweepDir, job_id: str, st: Any) -> int:
    """The tokens a job that has not ended starts (again) from when it is submitted: 0 before any attempt (no
    checkpoint to look for), else `resume_tokens`."""
    return resume_tokens(sdir, job_id) if st.attempts else 0


def _resume_how(sdir: SweepDir, job_id: str) -> tuple[str, int]:
    """What a resume does with an interrupted job, and the tokens it keeps (`resume_tokens`)."""
    kept = resume_tokens(sdir, job_id)
    if kept:
        return f"resumes it from its checkpoint at {kept:,} tokens", kept
    return "starts it again from its first step (no checkpoint)", 0


def resolve_name(name_or_file: str) -> str:
    """A sweep name, or the name inside a sweep file given by path. A path to no file (a sweep name has no '/' and
    does not end in .yaml) is refused as such, not looked up as a sweep of that name."""
    p = Path(name_or_file)
    looks_like_a_file = name_or_file.endswith((".yaml", ".yml")) or "/" in name_or_file
    if looks_like_a_file and not p.exists():
        from rla_ablate.errors import UserError

        raise UserError(f"{name_or_file}: no such file; give a sweep file or the name of a launched sweep")
    if looks_like_a_file and p.is_dir():
        from rla_ablate.errors import UserError

        if (p / "jobs.json").is_file() or (p / "sweep.json").is_file():
            raise UserError(f"{name_or_file} is a sweep's folder; give its name and root: {shell_arg(p.name)} "
                            f"--root {shell_arg(p.parent)}")
        if (p / "job.json").is_file():
            raise UserError(f"{name_or_file} is one job's folder (`rla-sweep train --out`), not a sweep: its metrics "
                            f"are in {p / 'metrics.jsonl'}; `rla-sweep eval` and `export` take the folder, this "
                            "command a sweep's name or file")
    if name_or_file.endswith((".yaml", ".yml")) and p.is_file():
        from rla_ablate.config import load_yaml

        data = load_yaml(p).data
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            return data["name"]
    return name_or_file


def note_other_file(root: str | Path, name_or_file: str) -> None:
    """For a sweep file given by path that is not the one its sweep was last launched with (the copy under --root):
    say on stderr that what the command shows is that launch's jobs, not this file's (a file with another token
    budget under the same name would otherwise read as its own results). Nothing for a name or the launched file."""
    import sys

    if not (name_or_file.endswith((".yaml", ".yml")) and Path(name_or_file).is_file()):
        return
    name = resolve_name(name_or_file)
    saved = SweepDir(root, name).path / "sweep.yaml"
    try:
        if not saved.is_file() or saved.read_bytes() == Path(name_or_file).read_bytes():
            return
    except OSError:
        return
    print(f"note: {name_or_file} is not the file sweep '{name}' was last launched with ({saved}): shown are that "
          "launch's jobs, not this file's", file=sys.stderr)


def check_root_folder(root: str | Path) -> None:
    """A --root that is a file is said to be one (not "no sweep under it; launch one there")."""
    if Path(root).exists() and not Path(root).is_dir():
        raise UserError(f"{root} is a file, not a folder; --root names the folder a launch wrote to", key="--root")


def sweep_job_folder(root: str | Path, sweep: str, job: str, key: str = "JOB") -> Path:
    """The folder of one job of a launched sweep, named as `status` shows it: its name (tiny-rla/seed0) or the start
    of its id; a UserError listing the jobs where none or several match."""
    sdir = open_sweep_dir(root, resolve_name(sweep))
    jobs = sdir.job_list() if sdir.has_job_list() else []
    named = [j for j in jobs if j.get("name") == job] or [j for j in jobs if job and j["job_id"].startswith(job)]
    if len(named) == 1:
        return sdir.job_dir(named[0]["job_id"])
    listed = named or jobs
    shown = ", ".join(f"{j.get('name')} ({j['job_id'][:8]})" for j in listed[:6])
    more = f" and {len(listed) - 6} more" if len(listed) > 6 else ""
    if named:
        raise UserError(f"{job!r} starts the ids of {len(named)} jobs of {sdir.name}: {shown}{more}; give more of it",
                        key=key)
    raise UserError(f"sweep {sdir.name} has no job {job!r}; its jobs (name or id): {shown or 'none yet'}{more}",
                    key=key)


def sweeps_with_job(root: str | Path, job: str) -> list[str]:
    """The launched sweeps under `root` that have a job named `job` (as `status` shows it) or whose id is `job`."""
    root = Path(root)
    if not job or not root.is_dir():
        return []
    found = []
    for listing in sorted(root.glob("*/jobs.json")):
        try:
            jobs = SweepDir(root, listing.parent.name).job_list()
        except UserError:  # an unreadable listing: not this command's to report
            continue
        if any(j.get("name") == job or j.get("job_id") == job for j in jobs):
            found.append(listing.parent.name)
    return found


def open_sweep_dir(root: str | Path, sweep: str) -> SweepDir:
    """The sweep's folder (its sweep.json written, whether or not a launch listed its jobs), or a UserError naming
    the sweeps that exist under `root`."""
    check_root_folder(root)
    sdir = SweepDir(root, sweep)
    if not sdir.exists():
        raise no_sweep(sdir, marker="sweep.json")
    return sdir


def open_sweep(root: str | Path, name_or_file: str) -> SweepDir:
    check_root_folder(root)
    sdir = SweepDir(root, resolve_name(name_or_file))
    if not sdir.path.is_dir() or not (sdir.path / "jobs.json").exists():
        raise no_sweep(sdir)
    return sdir


def no_sweep(sdir: SweepDir, marker: str = "jobs.json") -> UserError:
    """The error for a sweep that was never launched under its --root, naming the ones that were (the folders that
    hold `marker`)."""
    known = sorted(p.parent.name for p in sdir.root.glob(f"*/{marker}")) if sdir.root.is_dir() else []
    hint = (f"sweeps there: {', '.join(known)}" if known
            else f"launch one with `rla-sweep launch FILE --root {shell_arg(sdir.root)}`")
    return UserError(f"no sweep '{sdir.name}' under {sdir.root}; {hint}")


def sweep_status(sdir: SweepDir) -> dict[str, Any]:
    """The `status --json` document. Per job, `error` is one line ("Type: message" for a failure), `cause` why it
    did not finish (rla_ablate.outcome.Cause), `traceback` the last failed attempt's, `error_log` the file holding
    every failed attempt's traceback (None until one failed); a search sweep's jobs also `trial` (the Optuna trial
    that last ran it) and `value` (its value of the search's metric, None unless complete)."""
    from rla_ablate.sweep.search import trials_of_jobs

    live = sdir.lock_held_by_other()
    trials = trials_of_jobs(sdir)  # a search sweep's jobs: their Optuna trial and its value
    jobs = []
    for rec in sdir.job_list():
        st = sdir.status(rec["job_id"])
        status, error, done = st.status, st.error, int(st.tokens_done)
        if status in ACTIVE and not live and st.attempts:
            # what a resume keeps is the checkpoint, not the last progress the job reported (either may be ahead)
            how, done = _resume_how(sdir, rec["job_id"])
            status, error = Status.PENDING, error or INTERRUPTED.format(name=sdir.name, root=shell_arg(sdir.root), how=how)
        elif status == Status.CANCELLED and st.cause != Cause.PRUNED and not live:
            # likewise for a cancelled job: a launch stopped before it started reports 0 tokens, one stopped mid-step
            # the step it reached, and a resume continues from the checkpoint
            done = resume_tokens(sdir, rec["job_id"])
        log = sdir.error_log(rec["job_id"])
        jobs.append({"job_id": rec["job_id"], "name": rec["name"], "ablations": rec.get("ablations", []),
                     "control": rec.get("control"),
                     "status": status.value, "mlflow_run_id": st.mlflow_run_id, "tokens_done": done,
                     "tokens_target": int(rec.get("tokens_target") or st.tokens_target), "error": error,
                     "cause": st.cause.value if st.cause is not None else None, "traceback": st.traceback,
                     "error_log": str(log) if log.exists() else None, "notice": st.notice}
                    | (dict(zip(("trial", "value"), trials.get(rec["job_id"], (None, None)))) if trials else {}))
    # Embedded server: its SQLite store opens the runs after the launch (and its server) are gone.
    return {"sweep": sdir.name, "root": str(sdir.root), "tracking_uri": sdir.store_uri(), "jobs": jobs}


def cancel(sdir: SweepDir, wait_s: float, say=print) -> bool:
    """Ask the running launch to stop (jobs checkpoint first); True once it has exited within `wait_s`."""
    if not sdir.lock_held_by_other():
        changed = 0
        for rec in sdir.job_list():
            st = sdir.status(rec["job_id"])
            if st.status in ACTIVE:
                _writing(sdir, lambda: sdir.set_status(rec["job_id"], status=Status.CANCELLED,
                                                       error="cancelled by `rla-sweep cancel`"))
                changed += 1
        say(f"no launch of sweep '{sdir.name}' is running" + (f"; marked {changed} unfinished jobs cancelled"
                                                              if changed else ""))
        return True
    _writing(sdir, sdir.request_cancel)
    say(f"asked the launch of '{sdir.name}' to stop; its jobs save a checkpoint first")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not sdir.lock_held_by_other():
            if sdir.cancel_path.exists():  # the launch ended on its own before it read the request
                _writing(sdir, lambda: sdir.cancel_path.unlink(missing_ok=True))
                say(f"the launch ended on its own before it read the request: nothing was stopped; "
                    f"`rla-sweep status {sdir.name} --root {shell_arg(sdir.root)}` lists its jobs")
                return True
            say(f"stopped; `rla-sweep resume {sdir.name} --root {shell_arg(sdir.root)}` continues from the checkpoints")
            return True
        time.sleep(0.5)
    say(f"still stopping after {wait_s:.0f} s; check `rla-sweep status {sdir.name} --root {shell_arg(sdir.root)}`")
    return False


def _writing(sdir: SweepDir, write) -> None:
    """Run a write into the sweep folder; a read-only folder is a clear error, not a traceback."""
    try:
        write()
    except OSError as exc:
        raise UserError(f"cannot write to the sweep folder ({exc.strerror or exc}); `rla-sweep cancel` records "
                        "the request there", file=str(sdir.path)) from None
