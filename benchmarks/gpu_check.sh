#!/usr/bin/env bash
# One entry point on the GPU node, after the bundle is installed (PYTHONPATH=/tmp/site:$PWD):
#   bash benchmarks/gpu_check.sh [tests|triton-tests|models|glue|graph|scales|train-step|calibrate|rdn|memory|bench|profile|tune|train|train-profile|save-tuning|all]
#                                [pytest -k expr]
# GPU tests write a junit file, a log and every measured error to $OUT; the kernel table prints last.
#
# FLA autotunes each kernel per (H, K, V, dtypes, flags): a fresh node spent over 8 minutes on it (docs/RESULTS.md).
# `save-tuning` packs the node's *.autotune.json files (under 1 MB) into $OUT/autotune.tgz; unpack that here into
# .gpu/tcache/ (`mkdir -p .gpu/tcache && tar -xzf autotune.tgz -C .gpu/tcache`) and carry .gpu/tcache with the next
# call: this script seeds the Triton cache from it, and only the winning configurations compile again.
set -uo pipefail
what=${1:-all}
select=${2:-}
OUT=${OUT:-/tmp/rla-gpu-out}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export PYTHONUNBUFFERED=1
mkdir -p "$TRITON_CACHE_DIR"
for seed in benchmarks/gpu-tuning/triton-cache .gpu/tcache/triton-cache; do
    if [[ -d $seed ]]; then
        cp -rn "$seed"/. "$TRITON_CACHE_DIR"/
    fi
done
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, '| triton', triton.__version__, '| fla', fla.__version__)" || exit 1
export RLA_GPU_ERRORS=$OUT/errors.jsonl
if [[ $what == tests || $what == all ]]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_gpu.py ${select:+-k "$select"} \
        --junitxml="$OUT/junit.xml" >"$OUT/tests.log" 2>&1 || rc=1
    tail -n 25 "$OUT/tests.log"
fi
if [[ $what == triton-tests ]]; then
    # our kernels' cases (bf16, packed) before fp32, whose delta rule goes through FLA's kernels: a fresh node can
    # spend minutes autotuning those (over 200 s on one case was measured), which would hold the rest back
    for part in bf16 packed split fp32; do
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ops_gpu.py -k "triton and $part${select:+ and $select}" \
            --junitxml="$OUT/junit-triton-$part.xml" >"$OUT/tests-triton-$part.log" 2>&1 || rc=1
        tail -n 12 "$OUT/tests-triton-$part.log"
    done
fi
if [[ $what == models || $what == all ]]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_models_gpu.py --junitxml="$OUT/junit-models.xml" \
        >"$OUT/tests-models.log" 2>&1 || rc=1
    tail -n 25 "$OUT/tests-models.log"
fi
if [[ $what == glue ]]; then
    # FLA's fused glue (rla_ablate/models/fusion.py): its GPU test, then each 100m family's step with the fused and
    # the plain-torch glue side by side, profiled (where the time goes, the 25 costliest ops), rows calibrated
    # The small shape's cases first, then the wide ones (a fresh node autotunes FLA's kernels for each new shape, so
    # a call's time limit can cut this short): -v logs each case as it ends, so a cut log still says which passed.
    for shape in small wide; do
        python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_models_gpu.py -k "fused_glue and $shape" \
            --durations=5 --junitxml="$OUT/junit-glue-$shape.xml" >"$OUT/tests-glue-$shape.log" 2>&1 || rc=1
        grep -E "PASSED|FAILED|ERROR|passed|failed|slowest|s call" "$OUT/tests-glue-$shape.log" | tail -n 30
    done
    python3 benchmarks/train_gpu.py --scale 100m --glue auto torch --steps 6 --warmup 2 --profile 3 --top-ops 25 \
        --calibrate --json "$OUT/glue-100m.json" 2>&1 | tee "$OUT/glue-100m.log" || rc=1
    cp rla_ablate/sweep/calibration/h200.json "$OUT/h200.json"
fi
if [[ $what == graph ]]; then
    # train.cuda_graphs (rla_ablate/train/graphs.py): the training loop with its micro steps captured and replayed
    # against the eager loop (every family, a resume, the guard's skips), the benchmark's graphed step against its
    # eager one (same losses), then tokens/s side by side with where the time goes (a host-bound step gains what
    # the GPU waited), then the command line: a 100m job eager and graphed
    python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_train_gpu.py tests/test_benchmarks.py \
        -k "cuda_graph" --junitxml="$OUT/junit-graph.xml" >"$OUT/tests-graph.log" 2>&1 || rc=1
    grep -E "PASSED|FAILED|ERROR|passed|failed|Error" "$OUT/tests-graph.log" | tail -n 20
    python3 benchmarks/train_gpu.py --scale 100m --graph off on --steps 6 --warmup 2 --profile 3 \
        --json "$OUT/graph-100m.json" 2>&1 | tee "$OUT/graph-100m.log" || rc=1
    for graphs in false true; do
        python3 -m rla_ablate.cli train 100m-rla --out "/tmp/cli-graphs-$graphs" --set train.cuda_graphs=$graphs \
            --set model.vocab_size=257 --set train.tokens=1048576 --set train.batch_tokens=32768 \
            --set train.micro_batch_size=16 --set train.log_every_tokens=131072 \
            --set train.eval_every_tokens=1048576 --set train.checkpoint_every_tokens=1048576 >"$OUT/cli-graphs-$graphs.log" 2>&1 || rc=1
        tail -n 4 "$OUT/cli-graphs-$graphs.log"
        cp "/tmp/cli-graphs-$graphs/metrics.jsonl" "$OUT/cli-graphs-$graphs.jsonl"
    done
fi
if [[ $what == scales ]]; then
    # issue-style: every family at 100m and 1.5b in one run, eager and graphed, one summary table at the end
    python3 benchmarks/train_gpu.py --scale 100m 1.5b --graph off on --steps 6 --warmup 2 \
        --json "$OUT/scales.json" 2>&1 | tee "$OUT/scales.log" || rc=1
fi
if [[ $what == train-step || $what == all ]]; then
    # the real training step (run_job: bf16 autocast, backend auto, AdamW, eval, checkpoint) of every job a sweep
    # can produce: each family x each registry ablation x both controls, at the 100m presets' mixer shape
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_train_gpu.py ${select:+-k "$select"} \
        --junitxml="$OUT/junit-train-step.xml" >"$OUT/tests-train-step.log" 2>&1 || rc=1
    tail -n 30 "$OUT/tests-train-step.log"
fi
if [[ $what == calibrate ]]; then
    # peak memory, tokens/s and warm-up of each 100m preset alone on the GPU, eager and with CUDA graphs (the graphed
    # rows give graphed jobs their speed), merged into the calibration table (it refuses another device's table)
    python3 benchmarks/train_gpu.py --scale 100m --batch 16 --seq-len 2048 --graph off on --steps 6 --warmup 2 --calibrate \
        --json "$OUT/calibrate-100m.json" 2>&1 | tee "$OUT/calibrate.log" || rc=1
    cp rla_ablate/sweep/calibration/h200.json "$OUT/h200.json"
fi
if [[ $what == rdn ]]; then
    # RDN's auxiliary pass keeping its chunk states (rla_ablate/ops/triton/rdn.py, DeltaKeepStates): its op tests
    # (against FLA's Function and the float64 naive contract), the op kept vs recomputing side by side, every RDN
    # training step a sweep can produce, then the 100m step eager and graphed with GDN beside it; the rows join the
    # calibration table marked rdn_states_kept (their peaks hold the kept states)
    python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_ops_gpu.py -k "rdn_auxiliary or (triton and delta)" \
        --junitxml="$OUT/junit-rdn-ops.xml" >"$OUT/tests-rdn-ops.log" 2>&1 || rc=1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/tests-rdn-ops.log" | tail -n 12
    python3 benchmarks/rdn_aux.py 2>&1 | tee "$OUT/rdn-aux.log" || rc=1
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_train_gpu.py -k rdn \
        --junitxml="$OUT/junit-rdn-train.xml" >"$OUT/tests-rdn-train.log" 2>&1 || rc=1
    tail -n 8 "$OUT/tests-rdn-train.log"
    python3 benchmarks/train_gpu.py --scale 100m --families rdn gdn --graph off on --steps 6 --warmup 2 --calibrate \
        --json "$OUT/rdn-100m.json" 2>&1 | tee "$OUT/rdn-100m.log" || rc=1
    cp rla_ablate/sweep/calibration/h200.json "$OUT/h200.json"
fi
if [[ $what == memory ]]; then
    # What a training process holds outside its allocator (packing reserves CONTEXT_BYTES for it), one model after
    # another alone on the GPU, then the compiled Triton kernels with the largest per-thread stack: the driver keeps
    # local memory for every thread slot of the device at the largest stack a launched kernel needed
    # (the byte-level code-LM shape for each: MQAR's presets have a vocabulary of 128, too small for byte data).
    # First, in one process, which family's first step makes it grow, with the driver's stack size after each.
    python3 benchmarks/process_memory.py --phases 2>&1 | tee "$OUT/memory-phases.log" | grep -E '^\{|rror' || rc=1
    for model in proxy-lm-rla proxy-lm-sgla proxy-lm-transformer 100m-rla; do
        python3 benchmarks/process_memory.py "$model" --tokens 524288 --limit 100 >"$OUT/memory-$model.log" 2>&1 || rc=1
        grep -iE '^\{|error' "$OUT/memory-$model.log" | tee -a "$OUT/memory.log"
    done
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import process_memory as p
for s, r, n in p.largest_stacks(20): print(f'stack {s:>7,} B/thread  {r:>3} registers  {n}')" | tee -a "$OUT/memory.log" || rc=1
    # Then whether a process gives the autotuning's local memory back (rla_ablate/train/local_memory.py, what packing's
    # 1 GiB a process counts on): a spilling kernel, then a graphed run whose Triton cache is empty, so that FLA
    # autotunes (its lines "gave back the local memory", and the memory outside the allocator after them).
    # (and whether the GPU's Triton autotuner takes the packed jobs' gate only to time candidates: test_local_memory)
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_train_gpu.py tests/test_local_memory.py \
        -k "local_memory or times_candidates" 2>&1 | tail -n 3 | tee -a "$OUT/memory.log"
    empty=$(mktemp -d)
    TRITON_CACHE_DIR=$empty python3 benchmarks/process_memory.py proxy-lm-rla --graphs true --limit 170 \
        >"$OUT/memory-release.log" 2>&1 || rc=1
    grep -E 'outside the allocator|gave back|^\{' "$OUT/memory-release.log" | tee -a "$OUT/memory.log"
    rm -rf "$empty"
fi
if [[ $what == profile || $what == tune ]]; then
    python3 benchmarks/kernels.py --$what --seq-lens 2048 2>&1 | tee "$OUT/$what.log" || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    python3 benchmarks/kernels.py --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" || rc=1
fi
if [[ $what == train || $what == all ]]; then
    python3 benchmarks/train_gpu.py --json "$OUT/train.json" 2>&1 | tee "$OUT/train.log" || rc=1
fi
if [[ $what == train-profile ]]; then
    # every scale in one run (the proxies at the study's shapes: launch-bound steps), and where each family's
    # training step spends its time (GPU kernels by kind, GPU idle, the 25 costliest ops with their shapes); rows
    # join the calibration table
    python3 benchmarks/train_gpu.py --scale proxy-mqar proxy-lm 100m 1.5b --steps 6 --warmup 2 --profile 3 --top-ops 25 --calibrate \
        --json "$OUT/train-profile.json" \
        2>&1 | tee "$OUT/train-profile.log" || rc=1
fi
if [[ $what == save-tuning || $what == all ]]; then
    (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' -print0 \
        | tar -czf "$OUT/autotune.tgz" --transform 's,^\./,triton-cache/,' --null -T -) || rc=1
fi
exit $rc
