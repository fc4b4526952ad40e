#!/usr/bin/env bash
# A sweep on the GPU node, detached from the command that starts it (a node's command has a time limit; the
# sweep goes on, and `resume` picks up what a lost node left):
#   bash benchmarks/gpu_sweep.sh start  sweeps/gpu-100m.yaml   # launch in the background; log: $ROOT/launch.log
#   bash benchmarks/gpu_sweep.sh resume gpu-100m                # resume unfinished jobs in the background
#   bash benchmarks/gpu_sweep.sh wait   gpu-100m 540            # follow the launch's progress for up to 540 s
#   bash benchmarks/gpu_sweep.sh report gpu-100m [DASHBOARD ARGS] # status, per-job report, dashboard -> $OUT
#   bash benchmarks/gpu_sweep.sh follow gpu-100m 540 [DASHBOARD ARGS] # wait, then report if the launch has ended
#   bash benchmarks/gpu_sweep.sh restore DIR                   # unpack a report's sweep.tgz + tracking.tgz into $ROOT
# A sweep continues on a fresh node: `report` packs the sweep folder without checkpoints (sweep.tgz) and its
# tracking store (tracking.tgz); carry those two to the next node, `restore` them under the same RLA_ROOT, then
# `resume`: finished jobs stay finished with their MLflow runs, interrupted ones start again from their first step.
# RLA_MPS=1 with start/resume runs the jobs under CUDA MPS (a control daemon started here, if the node has one):
# kernels of the jobs packed on one GPU then run side by side instead of taking turns, which small jobs need.
# A node is given back after ~30 s without a command, and its /tmp with it: `follow` brings the results back in
# the same command that sees the launch end, so no call is needed after the last one. A `wait` or `follow` that
# runs out of time with the launch still running leaves a snapshot in $OUT (sweep.tgz, tracking.tgz: the sweep
# folder first, then a consistent copy of the SQLite store), so a node lost before the next call costs only the
# jobs that were running: `restore` the snapshot on a fresh node and `resume`.
# Before the launch, the autotune results already on this node ($TRITON_CACHE_DIR, e.g. from gpu_check.sh) join
# the shipped seeds (benchmarks/gpu-tuning), which the launch copies into the sweep's Triton cache.
set -uo pipefail
what=$1
arg=$2
ROOT=${RLA_ROOT:-/tmp/rla-runs}
OUT=${OUT:-/tmp/rla-gpu-out}
CACHE=${TRITON_CACHE_DIR:-/tmp/triton-cache}
mkdir -p "$ROOT" "$OUT"
export PYTHONUNBUFFERED=1
repo=$PWD

pack() {
    # The sweep folder without checkpoints, then its tracking store without artifacts; the SQLite files through
    # sqlite3's backup API, which copies a consistent state while a server may be writing. In this order a job
    # the folder calls finished has its MLflow run complete in the copy.
    tar -czf "$OUT/sweep.tgz" -C "$ROOT" --exclude='checkpoints' --exclude='triton-cache' --exclude='*.db' \
        --exclude='mlflow' "$arg" $(cd "$ROOT" && ls *.log 2>/dev/null)
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$tmp/$arg/mlflow"
    (cd "$ROOT/$arg/mlflow" && find . -maxdepth 1 -type f ! -name '*.db' -exec cp {} "$tmp/$arg/mlflow/" \;)
    for db in "$ROOT/$arg"/mlflow/*.db; do
        [[ -f $db ]] || continue
        python3 -c 'import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.close()
src.close()' "$db" "$tmp/$arg/mlflow/$(basename "$db")" || return 1
    done
    tar -czf "$OUT/tracking.tgz" -C "$tmp" "$arg/mlflow"
    rm -rf "$tmp"
}

case $what in
start|resume)
    if [[ -d $CACHE ]]; then
        (cd "$CACHE" && find . -name '*.autotune.json' | while read -r f; do
            [[ -e $repo/benchmarks/gpu-tuning/triton-cache/$f ]] || cp --parents "$f" "$repo/benchmarks/gpu-tuning/triton-cache/"
        done)
    fi
    if [[ ${RLA_MPS:-0} == 1 ]]; then
        export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps-pipe}
        export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if pgrep -f nvidia-cuda-mps-control >/dev/null; then
            echo "MPS: control daemon already running"
        elif nvidia-cuda-mps-control -d; then
            echo "MPS: control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
        else
            echo "MPS: could not start nvidia-cuda-mps-control; jobs share the GPU by taking turns" >&2
        fi
    fi
    verb=launch
    [[ $what == resume ]] && verb=resume
    setsid nohup python3 -m rla_ablate.cli "$verb" "$arg" --root "$ROOT" >"$ROOT/$verb.log" 2>&1 </dev/null &
    echo "$verb started (pid $!): $ROOT/$verb.log"
    ;;
wait|follow)
    # Print the launch's progress line and the GPU's load every 30 s until the background launch/resume exits or
    # the time runs out (a node's command has a time limit; the sweep goes on after it).
    limit=${3:-540}
    start=$SECONDS
    ended=0
    while (( SECONDS - start < limit )); do
        if ! pgrep -f "rla_ablate.cli (launch|resume) .*$arg" >/dev/null; then
            echo "[$(date +%T)] launch not running"; tail -n 25 "$ROOT"/launch.log "$ROOT"/resume.log 2>/dev/null
            ended=1
            break
        fi
        line=$(grep -a -E 'tok/s|finished|failed' "$ROOT"/launch.log "$ROOT"/resume.log 2>/dev/null | tail -n 1)
        gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | head -n 1)
        echo "[$(date +%T)] gpu ${gpu:-?} | ${line##*:}"
        sleep 30
    done
    if (( ! ended )); then
        echo "[$(date +%T)] still running after ${limit}s; snapshot for a lost node: $OUT/sweep.tgz, $OUT/tracking.tgz"
        pack
    fi
    if [[ $what == follow && $ended == 1 ]]; then
        shift $(( $# < 3 ? $# : 3 ))
        exec bash "$0" report "$arg" "$@"
    fi
    ;;
restore)
    # $arg: a folder holding a report's sweep.tgz and tracking.tgz
    for f in sweep.tgz tracking.tgz; do
        [[ -f $arg/$f ]] || { echo "restore: no $arg/$f" >&2; exit 2; }
    done
    tar -xzf "$arg/sweep.tgz" -C "$ROOT" && tar -xzf "$arg/tracking.tgz" -C "$ROOT" || exit 1
    ls "$ROOT"
    ;;
report)
    shift 2
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" | tee "$OUT/status.txt"
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" --json >"$OUT/status.json"
    python3 benchmarks/sweep_report.py "$arg" --root "$ROOT" --json "$OUT/report.json" | tee "$OUT/report.txt"
    python3 -m rla_ablate.cli dashboard "$arg" --root "$ROOT" "$@" 2>&1 | tail -n 20
    # the launch's own log and the last lines of every attempt that failed (an out-of-memory report names what
    # each process on the GPU held), so a report says why jobs reran without a second call to the node
    cp "$ROOT"/launch.log "$ROOT"/resume.log "$OUT"/ 2>/dev/null
    for f in "$ROOT/$arg"/jobs/*/error.log; do
        [[ -f $f ]] && { echo "== $f"; tail -n 8 "$f"; }
    done >"$OUT/errors.txt"
    # The sweep and its tracking store, so the dashboards can be rendered again elsewhere (`--root` at the unpacked
    # folder) and a sweep that did not finish goes on there (`restore`, then `resume`).
    pack
    # The autotune results the sweep's jobs found (seeds for the next node: benchmarks/gpu-tuning/triton-cache).
    (cd "$ROOT/$arg/triton-cache" 2>/dev/null && find . -name '*.autotune.json' -print0 |
        tar -czf "$OUT/autotune.tgz" --null -T -)
    ls -la "$OUT"
    ;;
*)
    echo "usage: bash benchmarks/gpu_sweep.sh start SWEEP_FILE | resume SWEEP | wait SWEEP [SECONDS] | follow SWEEP SECONDS [DASHBOARD ARGS] | report SWEEP [DASHBOARD ARGS] | restore DIR" >&2
    exit 2
    ;;
esac
