#!/usr/bin/env bash
# One entry point on the GPU node, after the bundle is installed (PYTHONPATH=/tmp/site:$PWD):
#   bash benchmarks/gpu_check.sh [tests|bench|train|all]
# GPU tests write a junit file, a log and every measured error to $OUT; the kernel table prints last.
# One Triton cache for the whole node: FLA's first call compiles and autotunes for minutes.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/rla-gpu-out}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export PYTHONUNBUFFERED=1
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, '| triton', triton.__version__, '| fla', fla.__version__)" || exit 1
if [[ $what == tests || $what == all ]]; then
    export RLA_GPU_ERRORS=$OUT/errors.jsonl
    rm -f "$RLA_GPU_ERRORS"
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_gpu.py --junitxml="$OUT/junit.xml" >"$OUT/tests.log" 2>&1 || rc=1
    tail -n 25 "$OUT/tests.log"
fi
if [[ $what == bench || $what == all ]]; then
    python3 benchmarks/kernels.py --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" || rc=1
fi
if [[ $what == train ]]; then
    python3 benchmarks/train_gpu.py --json "$OUT/train.json" 2>&1 | tee "$OUT/train.log" || rc=1
fi
exit $rc
