#!/usr/bin/env bash
# A sweep on the GPU node, detached from the command that starts it (a node's command has a time limit; the
# sweep goes on, and `resume` picks up what a lost node left):
#   bash benchmarks/gpu_sweep.sh start  sweeps/gpu-100m.yaml   # launch in the background; log: $ROOT/launch.log
#   bash benchmarks/gpu_sweep.sh resume gpu-100m                # resume unfinished jobs in the background
#   bash benchmarks/gpu_sweep.sh wait   gpu-100m 540            # follow the launch's progress for up to 540 s
#   bash benchmarks/gpu_sweep.sh report gpu-100m [DASHBOARD ARGS] # status, per-job report, dashboard -> $OUT
#   bash benchmarks/gpu_sweep.sh follow gpu-100m 540 [DASHBOARD ARGS] # wait, then report if the launch has ended
# A node is given back after ~30 s without a command, and its /tmp with it: `follow` brings the results back in
# the same command that sees the launch end, so no call is needed after the last one.
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
case $what in
start|resume)
    if [[ -d $CACHE ]]; then
        (cd "$CACHE" && find . -name '*.autotune.json' | while read -r f; do
            [[ -e $repo/benchmarks/gpu-tuning/triton-cache/$f ]] || cp --parents "$f" "$repo/benchmarks/gpu-tuning/triton-cache/"
        done)
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
    (( ended )) || echo "[$(date +%T)] still running after ${limit}s"
    if [[ $what == follow && $ended == 1 ]]; then
        shift $(( $# < 3 ? $# : 3 ))
        exec bash "$0" report "$arg" "$@"
    fi
    ;;
report)
    shift 2
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" | tee "$OUT/status.txt"
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" --json >"$OUT/status.json"
    python3 benchmarks/sweep_report.py "$arg" --root "$ROOT" --json "$OUT/report.json" | tee "$OUT/report.txt"
    python3 -m rla_ablate.cli dashboard "$arg" --root "$ROOT" "$@" 2>&1 | tail -n 20
    tar -czf "$OUT/sweep.tgz" -C "$ROOT" --exclude='checkpoints' --exclude='triton-cache' --exclude='*.db' \
        --exclude='mlflow' "$arg" $(cd "$ROOT" && ls *.log 2>/dev/null)
    # The tracking store, so the dashboards can be rendered again elsewhere (`--root` at the unpacked folder).
    tar -czf "$OUT/tracking.tgz" -C "$ROOT" --exclude='artifacts' "$arg/mlflow"
    # The autotune results the sweep's jobs found (seeds for the next node: benchmarks/gpu-tuning/triton-cache).
    (cd "$ROOT/$arg/triton-cache" 2>/dev/null && find . -name '*.autotune.json' -print0 |
        tar -czf "$OUT/autotune.tgz" --null -T -)
    ls -la "$OUT"
    ;;
*)
    echo "usage: bash benchmarks/gpu_sweep.sh start SWEEP_FILE | resume SWEEP | wait SWEEP [SECONDS] | follow SWEEP SECONDS [DASHBOARD ARGS] | report SWEEP [DASHBOARD ARGS]" >&2
    exit 2
    ;;
esac
