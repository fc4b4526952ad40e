#!/usr/bin/env bash
# A sweep on the GPU node, detached from the command that starts it (a node's command has a time limit; the
# sweep goes on, and `resume` picks up what a lost node left):
#   bash benchmarks/gpu_sweep.sh start  sweeps/gpu-100m.yaml   # launch in the background; log: $ROOT/launch.log
#   bash benchmarks/gpu_sweep.sh resume gpu-100m                # resume unfinished jobs in the background
#   bash benchmarks/gpu_sweep.sh report gpu-100m                # status, per-job report, dashboard -> $OUT
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
report)
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" | tee "$OUT/status.txt"
    python3 -m rla_ablate.cli status "$arg" --root "$ROOT" --json >"$OUT/status.json"
    python3 benchmarks/sweep_report.py "$arg" --root "$ROOT" --json "$OUT/report.json" | tee "$OUT/report.txt"
    python3 -m rla_ablate.cli dashboard "$arg" --root "$ROOT" 2>&1 | tail -n 20
    tar -czf "$OUT/sweep.tgz" -C "$ROOT" --exclude='checkpoints' --exclude='triton-cache' --exclude='*.db' \
        --exclude='mlflow' "$arg" $(cd "$ROOT" && ls *.log 2>/dev/null)
    ;;
*)
    echo "usage: bash benchmarks/gpu_sweep.sh start SWEEP_FILE | resume SWEEP | report SWEEP" >&2
    exit 2
    ;;
esac
