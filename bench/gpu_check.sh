#!/usr/bin/env bash
# The GPU check in one command (make gpu-check): on a CUDA machine, in about ten minutes,
# every part below with its own time limit; results in bench/results/*_cuda.csv, the
# executed notebooks and every log in a folder (and copied to OUT, with one archive of
# them all, OUT/gpu_check.tar.gz). Without CUDA: say so, check that the scripts run on
# the CPU with the tiny preset, and exit 0 when they do.
#
#   bash bench/gpu_check.sh [OUT]                    # every part
#   PARTS="chapter11 train t4" bash bench/gpu_check.sh OUT   # some of them
#
# The parts, in order (a part that fails or runs out of time is reported and the others
# still run; the exit status is 1 if any part failed):
#   chapter11   chapter 11 alone (its timings are the book's): notebooks_cuda.csv
#   train       bench/train_gpu.py: smol's Trainer vs LlamaForCausalLM, SmolLM2-135M,
#               T=2048, bf16, compiled, the batch the GPU's memory holds, and where a
#               step's time goes: train_gpu_cuda.csv, train_gpu_profile_cuda.csv
#   t4          bench/t4_path.py: float16 + GradScaler, the memory-efficient kernel,
#               repeat_kv before SDPA: t4_path_cuda.csv
#   chapters    the chapters that need no released weights (0-6, 10), four at a time,
#               beside `mutants`
#   mutants     tests/gpu_mutants.py: the mutants only a GPU kills: gpu_mutants_cuda.csv
#   weights     the chapters that load the released weights (7-9, 12-14; chapter 14
#               scores all of MMLU)
#   eval        bench/eval_all.py: smol eval all (MMLU and the card's seven other
#               benchmarks) over every whole split, bfloat16, timed: eval_all_cuda.csv
#   generate    bench/generate.py --device cuda (eager paths): generate_cuda.csv
# bench/store_gpu_outputs.py then stores the executed chapters' GPU-only cells.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-}
PARTS=${PARTS:-chapter11 train t4 chapters mutants weights eval generate}
RESULTS=bench/results
WORK=$(mktemp -d "${TMPDIR:-/tmp}/smol-gpu-check.XXXXXX")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS="ignore:IProgress not found:Warning"
start_all=$SECONDS

wanted() { [[ " $PARTS " == *" $1 "* ]]; }

part() {  # part NAME SECONDS COMMAND...: run COMMAND with a time limit, log, never abort
    local name=$1 limit=$2 start=$SECONDS rc=0
    shift 2
    wanted "$name" || return 0
    echo "== [$(date -u +%H:%M:%S)] $name (limit ${limit} s)"
    timeout --kill-after=15 "$limit" "$@" >"$WORK/$name.log" 2>&1 || rc=$?
    tail -n 40 "$WORK/$name.log"
    if [ "$rc" -eq 0 ]; then
        echo "== $name: ok in $((SECONDS - start)) s" | tee -a "$WORK/parts.log"
    else
        [ "$rc" -eq 124 ] && why="out of time" || why="exit status $rc"
        echo "== $name: FAILED ($why after $((SECONDS - start)) s; log $name.log)" |
            tee -a "$WORK/parts.log"
    fi
}

touch "$WORK/parts.log"
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    "$PY" -c "import torch; print('CUDA:', torch.cuda.get_device_name(0), '| torch', torch.__version__)" |
        tee "$WORK/device.log"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv >>"$WORK/device.log" 2>&1 || true
    NOTEBOOKS=("$PY" bench/run_notebooks.py --out "$WORK/notebooks" --timeout 240)
    part chapter11 110 "${NOTEBOOKS[@]}" --csv "$WORK/notebooks_1.csv" --only 11 --jobs 1
    part train 150 "$PY" bench/train_gpu.py --device cuda --json "$WORK/train_gpu_cuda.json" \
        --csv "$RESULTS/train_gpu_cuda.csv" --profile-csv "$RESULTS/train_gpu_profile_cuda.csv"
    part t4 40 "$PY" bench/t4_path.py --csv "$RESULTS/t4_path_cuda.csv"
    # the mutants' small tests beside the chapters: neither times anything the book shows
    part mutants 100 "$PY" -m tests.gpu_mutants --csv "$RESULTS/gpu_mutants_cuda.csv" &
    part chapters 100 "${NOTEBOOKS[@]}" --csv "$WORK/notebooks_2.csv" \
        --skip 7,8,9,11,12,13,14 --jobs 4
    wait
    part weights 220 "${NOTEBOOKS[@]}" --csv "$WORK/notebooks_3.csv" \
        --only 7,8,9,12,13,14 --jobs 6
    part eval 150 "$PY" bench/eval_all.py --device cuda --dtype bfloat16 \
        --token-budget 32768 --csv "$RESULTS/eval_all_cuda.csv"
    # (chapter 9 times the compiled paths on the GPU: compiling them again here would
    # take most of this part's minute)
    part generate 70 "$PY" bench/generate.py --device cuda --runs 2 --new-tokens 128 \
        --batches 1,4,16 --no-llama-cpp --csv "$RESULTS/generate_cuda.csv"
    # one table of every chapter's time on this GPU
    if ls "$WORK"/notebooks_*.csv >/dev/null 2>&1; then
        { head -n 1 "$(ls "$WORK"/notebooks_*.csv | head -n 1)"
          for f in "$WORK"/notebooks_*.csv; do tail -n +2 "$f"; done | sort
        } >"$RESULTS/notebooks_cuda.csv"
    fi
    results=("$RESULTS"/*_cuda.csv)
else
    echo "no CUDA device here: nothing runs on a GPU. Checking that the scripts run on the CPU"
    echo "with the tiny preset instead (their results go to $WORK, not bench/results)."
    PARTS="notebooks-list train generate eval mutants"
    part notebooks-list 30 "$PY" bench/run_notebooks.py --out "$WORK/notebooks" --list
    part train 300 "$PY" bench/train_gpu.py --preset tiny --device cpu --batch-size 2 \
        --seq-len 64 --steps 2 --warmup 1 --rounds 1 --csv "$WORK/train_gpu_cpu.csv"
    part generate 300 "$PY" bench/generate.py --preset tiny --device cpu --new-tokens 4 \
        --runs 1 --batches 1,2 --only "smol, bf16;int8 weights, bf16;speculative (summary)" \
        --csv "$WORK/generate_cpu.csv"
    part eval 120 "$PY" bench/eval_all.py --device cpu --threads 1 --limit 2 \
        --csv "$WORK/eval_all_cpu.csv"
    part mutants 60 "$PY" -m tests.gpu_mutants --check
    results=("$WORK/train_gpu_cpu.csv" "$WORK/generate_cpu.csv" "$WORK/eval_all_cpu.csv")
fi

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    for f in "${results[@]}" "$WORK"/*.log "$WORK"/*.json; do
        [ -f "$f" ] && cp "$f" "$OUT/"
    done
    [ -d "$WORK/notebooks" ] && cp -r "$WORK/notebooks" "$OUT/"
    tar czf "$WORK/gpu_check.tar.gz" -C "$OUT" . && mv "$WORK/gpu_check.tar.gz" "$OUT/"
    echo "results copied to $OUT (and archived in $OUT/gpu_check.tar.gz)"
fi
echo "== done in $((SECONDS - start_all)) s"
cat "$WORK/parts.log"
if grep -q FAILED "$WORK/parts.log"; then
    exit 1
fi
echo "every part passed"
