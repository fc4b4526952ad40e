"""`rla-sweep plan FILE`: every job of a sweep with params, state, FLOPs and GPU-hours, before anything runs."""

from __future__ import annotations

import argparse
import json
import os

from rla_ablate.environment import add_root_option
from rla_ablate.terminal import count


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="list a sweep's jobs with params, state size, FLOPs/token, tokens and GPU-hours",
        description="Expand and validate a sweep file without running anything; open each distinct data config "
                    "and eval set of its jobs once and take a batch (a config that cannot be read is reported "
                    "at its line, exit 2). Peak GPU memory and GPU-hours "
                    "come from the calibration table of measured H200 runs (rla_ablate/sweep/calibration/); GPU "
                    "shares are for this machine's GPU, or the calibration device without one. A CPU sweep "
                    "(resources.gpus: 0) is timed here instead: each distinct job shape's step, within 5 s.")
    parser.add_argument("file", help="the sweep file (YAML)")
    parser.add_argument("--json", action="store_true",
                        help='print {"jobs": [{job_id, name, family, ablations, control, params, state_elements, '
                             'flops_per_token, tokens, mem_gib, mem_glue, cuda_graphs, mem_graph_pool_gib, gpu_share, '
                             'tokens_per_s, gpu_hours, cost_source, control_report}], '
                             '"totals": {...}}')
    add_root_option(parser, help="where a launch of the sweep would run: a search's existing study there is "
                                 "checked and its trials counted")
    parser.set_defaults(func=run)


def _gpu_time(hours: float, short: bool = False) -> str:
    """GPU time in the unit that shows it: '2.40 GPU-hours', '12 GPU-minutes', '8 GPU-seconds' (short: '2.40h',
    '12m', '8s'); a smoke sweep's few seconds are not '0.00 GPU-hours'."""
    for value, unit in ((hours, "hour"), (hours * 60, "minute"), (hours * 3600, "second")):
        if value >= 1 or unit == "second":
            text = f"{value:,.2f}" if unit == "hour" else f"{max(value, 1):,.0f}" if value >= 0.5 else "<1"
            if short:
                return text + unit[0]
            return f"{text} GPU-{unit}{'' if text in ('1', '<1') else 's'}"
    raise AssertionError("unreachable")


def _trials_done(sweep, root: str) -> int | None:
    """The trials a search's existing study under `root` has used up (None: no study there yet), after the check a
    launch makes: a study made for another question (metric, space, base job) is refused here as there."""
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, sweep.name)
    if not sdir.optuna_path.exists():
        return None
    from rla_ablate.sweep.search import check_study, counted, make_study

    study = make_study(sweep.config.search, sweep.name, sdir.optuna_uri)
    check_study(study, sweep, sdir)
    return counted(study)


def _jobs_done(sweep, root: str) -> int | None:
    """How many of the expansion's jobs an earlier launch under `root` finished or saw diverge, which a launch does
    not run again (None: the sweep has no folder there yet)."""
    from rla_ablate.outcome import TERMINAL
    from rla_ablate.sweep.state import SweepDir

    sdir = SweepDir(root, sweep.name)
    if not sdir.has_job_list():
        return None
    return sum(sdir.status(job.job_id).status in TERMINAL for job in sweep.jobs)


def _h(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def run(args: argparse.Namespace) -> int:
    from rla_ablate.sweep.datacheck import check_data
    from rla_ablate.sweep.expand import check_sweep_file, load_sweep
    from rla_ablate.sweep.plan import plan

    check_sweep_file(args.file)
    sweep = load_sweep(args.file)
    checked = check_data(sweep)
    from rla_ablate.sweep.launch import check_evals

    check_evals(sweep)
    doc = plan(sweep)
    if doc["totals"]["runs_on"] == "cpu":
        # no calibration for CPUs: each distinct job shape's step timed here
        from rla_ablate.sweep.cputime import estimate

        search = sweep.config.search
        doc["totals"]["cpu_estimate"] = estimate([j.job for j in sweep.jobs], float(sweep.config.resources.cpus),
                                                 data_s=checked.seconds / max(1, checked.data + checked.evals),
                                                 repeat=search.n_trials if search else 1)
    if sweep.config.search is not None:
        doc["totals"]["search_trials_done"] = _trials_done(sweep, args.root)
    else:
        doc["totals"]["jobs_done"] = _jobs_done(sweep, args.root)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.markup import escape

    from rla_ablate.sweep.plan import variant_label
    from rla_ablate.terminal import fitted_table, stdout_console

    t = doc["totals"]
    packing = f", {t['jobs_per_gpu']:g} jobs per GPU" if t["jobs_per_gpu"] else ""
    from rla_ablate.sweep.progress import fmt_duration

    if t["runs_on"] == "cpu":
        c = t["cpu_estimate"]
        when = (f"about {fmt_duration(c['seconds'] + 5)} to {fmt_duration(c['seconds'] + 20)} on this machine, "
                f"{c['jobs_at_once']} at a time" if c["seconds"] is not None else
                f"no time estimate: no job's step ran here ({c['failed']})")
        title = (f"sweep {t['sweep']}: {count(t['jobs'], 'job')}, {_h(t['tokens'])} tokens on the CPU "
                 f"(resources.gpus: 0): {escape(when)}. On one GPU ({t['gpu']}) "
                 f"{'it' if t['jobs'] == 1 else 'they'} "
                 f"would take {_gpu_time(t['gpu_hours'])} (resources.gpus: auto)")
    else:
        title = (f"sweep {t['sweep']}: {count(t['jobs'], 'job')}, {_h(t['tokens'])} tokens, "
                 f"{_gpu_time(t['gpu_hours'])}; peak memory up to {_gib(t['max_mem_gib'])} GiB of "
                 f"{t['gpu_memory_gib']:g} ({t['gpu']}){packing}")
    # a CPU sweep's speed columns are the calibration GPU's (the title says so): their headers say it too
    speed = "GPU tok/s" if t["runs_on"] == "cpu" else "tok/s"
    columns = ["job", "id", "family", "variant", "params", "state/layer", "FLOPs/tok", "tokens", "mem GiB",
               "GPU share", speed, "GPU time"]
    rows = [[escape(r["name"]), r["job_id"][:8], r["family"], escape(variant_label(r["ablations"], r["control"])),
             _h(r["params"]), _h(r["state_elements"]), _h(r["flops_per_token"]), _h(r["tokens"]),
             _gib(r["mem_gib"]), f"{r['gpu_share']:.2f}" if r["gpu_share"] else "-", _h(r["tokens_per_s"]),
             _gpu_time(r["gpu_hours"], short=True)] for r in doc["jobs"]]
    sources = sorted({r["cost_source"] for r in doc["jobs"]})
    where = t["speeds_measured_on"]
    if t["gpu"] not in (where, "this machine's GPU"):
        where += f" (the calibration table's GPU, not this machine's {t['gpu']}: its speeds differ)"
    captions = [f"tok/s alone on one {where} from: " + "; ".join(sources), checked.line()]
    if t["runs_on"] != "cpu":
        captions.insert(1, _glue_caption(doc["jobs"]))
    elif t["cpu_estimate"]["seconds"] is not None:
        c = t["cpu_estimate"]
        timed = (f"each of the {c['shapes']} job shapes' step timed here ({c['timing_s']:.1f} s)"
                 if c["timed_shapes"] == c["shapes"] else
                 f"{c['timed_shapes']} of the {c['shapes']} job shapes' steps timed here ({c['timing_s']:.1f} s), the "
                 "others priced at their FLOP/s")
        captions.insert(1, f"CPU time: {timed}; {fmt_duration(c['job_seconds'])} over all jobs (of which "
                           f"{fmt_duration(c['setup_seconds'])} building models and opening data), placed longest first on "
                           f"{c['jobs_at_once']} at a time (this machine's {os.cpu_count()} cores over resources.cpus "
                           f"{sweep.config.resources.cpus:g}), and the launch's start-up (Ray and MLflow, 5-20 s); "
                           "checkpoints and logging add to it")
    if t["budgets"]:
        captions += ["matched wall-clock budgets (tok/s above are each job's own estimate):"] + t["budgets"]
    if "search_trials" in t:
        from rla_ablate.sweep.search import space_text

        s, done = t["search"], t["search_trials_done"]
        so_far = ("" if done is None else f"; its study under {escape(args.root)} has {done} of them done, so a launch "
                  + (f"runs the {t['search_trials'] - done} left" if done < t["search_trials"] else "runs none"))
        captions.append(f"Optuna search: the base job above (its id is no trial's: each trial's job has its own) runs "
                        f"as {t['search_trials']} trials (totals include them), each with "
                        f"{escape(space_text(s['params']))}; {s['direction']} {escape(s['metric'])} "
                        f"({s['sampler']} sampler, {s['pruner']} pruner){so_far}")
    if t.get("jobs_done") is not None:
        left = t["jobs"] - t["jobs_done"]
        captions.append(f"under {escape(args.root)}: {t['jobs_done']} of these jobs are done (finished or diverged), so "
                        + (f"a launch runs the {left} left" if left else "a launch runs none"))
    from rla_ablate.sweep.plan import unset_budget_note

    unset = unset_budget_note(sweep, t["runs_on"] == "cpu")
    if unset:
        captions.insert(0, f"[bold]{escape(unset)}[/]")
    from rla_ablate.sweep.launch import local_gpus, local_shortfall

    short = local_shortfall(sweep)
    if short is not None:  # not an error here: the sweep may be meant for a cluster (launch --address)
        # first under the table, where it is seen: the rest of the captions explain the columns
        captions.insert(0, f"[bold yellow]a launch on this machine stops[/] at {short.key}: {escape(short.message)}; "
                           "`launch --address` of a Ray cluster that has them runs it")
    elif t["runs_on"] != "cpu" and not local_gpus():
        captions.insert(0, f"[bold yellow]this machine has no GPU[/]: a launch here trains every job on the CPU "
                           f"({_h(t['tokens'])} tokens), far slower than the GPU times above; `launch --address` of a "
                           "Ray cluster with GPUs runs them there")
        # what a launch on a GPU of the table's size would refuse (a job larger than the GPU): said here, where the
        # machine has no GPU to check it against
        from rla_ablate.errors import UserError
        from rla_ablate.sweep.packing import place

        try:
            place(sweep, int(t["gpu_memory_gib"] * 2**30))
        except UserError as exc:
            captions.insert(0, f"[bold yellow]a launch on a GPU of {t['gpu_memory_gib']:g} GiB ({escape(t['gpu'])}) "
                               f"stops[/] at {exc.key}: {escape(exc.message)}")
    console = stdout_console()
    # a narrow terminal loses the columns least needed to choose what to run first
    console.print(fitted_table(console, title, columns, rows, keep=1, right=tuple(columns[4:]), captions=captions,
                               drop_order=["FLOPs/tok", "state/layer", "id", "params", speed, "GPU share",
                                           "tokens", "family", "mem GiB", "GPU time", "variant"]))
    return 0


def _gib(value: float) -> str:
    """GiB to one decimal, and a tiny model's memory as what it is rather than 0.0."""
    return f"{value:.1f}" if value >= 0.05 else f"{value:.2g}" if value > 0 else "0"


def _glue_caption(jobs: list[dict]) -> str:
    """Which glue the memory estimates assume (plan --json: mem_glue), and how to ask for the other."""
    from rla_ablate import environment

    glues = sorted({r["mem_glue"] for r in jobs})
    what = {"fused": "FLA's fused glue", "torch": "the plain-torch glue"}
    said = " and ".join(f"{what[g]} ({count(sum(r['mem_glue'] == g for r in jobs), 'job')})" for g in glues)
    other = ("" if environment.glue_mode() == "torch"
             else f"; {environment.GLUE_ENV}=torch estimates the plain-torch glue")
    graphed = sum(r["cuda_graphs"] for r in jobs)
    graphs = (f"; {count(graphed, 'job')} {'replays' if graphed == 1 else 'replay'} CUDA graphs (train.cuda_graphs): "
              "their memory includes the graph's pool" if graphed else "")
    from rla_ablate.sweep.calibration import CONTEXT_BYTES, TUNING_BYTES, GiB

    shares = (f"; a GPU share adds {CONTEXT_BYTES / GiB:g} GiB for the job's process, and {TUNING_BYTES / GiB:g} GiB of "
              "each GPU stays free for the one packed job that autotunes at a time")
    return f"memory estimated for {said}{other}{graphs}{shares}"

