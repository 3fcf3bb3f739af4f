#!/usr/bin/env bash
# The GPU check in one command (make gpu-check): on a CUDA machine, within about 8 minutes,
# execute every chapter notebook on the GPU, run bench/train_gpu.py (smol vs LlamaForCausalLM,
# T=2048, bf16, compiled) and bench/generate.py --device cuda, and write the results to
# bench/results/*_cuda.csv. Without CUDA: say so, check that the scripts run on the CPU with the
# tiny preset, and exit 0 when they do.
#
#   bash bench/gpu_check.sh [OUT]    # OUT: also copy the results (and executed notebooks) there
#
# Every part has its own time limit; a part that fails or runs out of time is reported and the
# others still run; the exit status is 1 if any part failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-}
RESULTS=bench/results
WORK=$(mktemp -d "${TMPDIR:-/tmp}/smol-gpu-check.XXXXXX")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS="ignore:IProgress not found:Warning"
failed=()
start_all=$SECONDS

part() {  # part NAME SECONDS COMMAND...: run COMMAND with a time limit, log, never abort
    local name=$1 limit=$2 start=$SECONDS rc=0
    shift 2
    echo "== [$(date -u +%H:%M:%S)] $name (limit ${limit} s)"
    timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$WORK/$name.log" || rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        echo "== $name: ok in $((SECONDS - start)) s"
    else
        [ "$rc" -eq 124 ] && why="out of time" || why="exit status $rc"
        echo "== $name: FAILED ($why after $((SECONDS - start)) s; log $WORK/$name.log)"
        failed+=("$name")
    fi
}

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$PY" -c "import torch; print('CUDA:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
    part notebooks 240 "$PY" bench/run_notebooks.py --out "$WORK/notebooks" --jobs 4 --timeout 200
    part train 120 "$PY" bench/train_gpu.py --device cuda --json "$WORK/train_gpu_cuda.json" \
        --csv "$RESULTS/train_gpu_cuda.csv"
    part generate 120 "$PY" bench/generate.py --device cuda --compile --runs 2 \
        --csv "$RESULTS/generate_cuda.csv"
    results=("$RESULTS/train_gpu_cuda.csv" "$RESULTS/generate_cuda.csv")
else
    echo "no CUDA device here: nothing runs on a GPU. Checking that the scripts run on the CPU"
    echo "with the tiny preset instead (their results go to $WORK, not bench/results)."
    part notebooks-list 30 "$PY" bench/run_notebooks.py --out "$WORK/notebooks" --list
    part train 300 "$PY" bench/train_gpu.py --preset tiny --device cpu --batch-size 2 \
        --seq-len 64 --steps 2 --warmup 1 --rounds 1 --csv "$WORK/train_gpu_cpu.csv"
    part generate 300 "$PY" bench/generate.py --preset tiny --device cpu --new-tokens 4 \
        --runs 1 --batches 1,2 --only "smol, bf16;int8 weights, bf16;speculative (summary)" \
        --csv "$WORK/generate_cpu.csv"
    results=("$WORK/train_gpu_cpu.csv" "$WORK/generate_cpu.csv")
fi

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    for f in "${results[@]}" "$WORK"/*.log "$WORK"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/"; done
    [ -d "$WORK/notebooks" ] && cp -r "$WORK/notebooks" "$OUT/" || true
    echo "results copied to $OUT"
fi
echo "== done in $((SECONDS - start_all)) s; results: ${results[*]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED parts: ${failed[*]}"
    exit 1
fi
echo "every part passed"
