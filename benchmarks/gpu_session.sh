#!/usr/bin/env bash
# One run on a lent CUDA machine (about 9 minutes), results under $OUT:
#   1. the runtime on CUDA (issue 33): eager vs the static cache as CUDA graphs (no inductor) vs
#      the compiled runtime (inductor + CUDA graphs, runtime.compile=true) for vanilla, an EAGLE-3
#      chain and DFlash + FailFast, beside HF's rows -- benchmarks/runtime.py ->
#      runtime-cuda-graphs.json, runtime-cuda-compiled.json;
#   2. the family's drafters trained there (issues 31, 32): benchmarks/gpu_train.sh -> gpu-weights.tar.
# Each part has its own time limit, so one that overruns leaves the other's results.
#
# Usage, from the repository root on the CUDA machine:
#   OUT=/tmp/gpu-out bash benchmarks/gpu_session.sh [bench_s=260] [train_s=280]
# bench_s=0: training only; SMOKE=1 checks the CUDA runtime for token identity (runtime.py --quick, batched
# rows included, greedy and sampled) beside the training, timings void (SMOKE_S its limit, SMOKE_MODES the
# CUDA modes, default "cudagraphs reduce-overhead"); JOBS, DFLASH_LR, DISTILL, DEADLINE:
# see gpu_train.sh.
# What the machine lacks travels in ignored folders of the checkout: Python wheels in .whl/
# (installed to /tmp/site), GSM8K train as .gpu/train.jsonl.gz (or set DATA).
# Float32 on CUDA: the greedy outputs are then compared token for token with eager vanilla's.
# A CPU dry run: DEVICE=cpu QUICK=1 TINY=1 NO_WHEELS=1 bash benchmarks/gpu_session.sh 600 300
# Real-scale profiles and the replay of runs at real sizes (issue 48 item 6) are their own run:
# benchmarks/gpu_real_scale.sh (docs/how-to/real-scale.md).
set -u
OUT=${OUT:-/tmp/gpu-out}
BENCH_S=${1:-260}
TRAIN_S=${2:-280}
DEVICE=${DEVICE:-cuda}
export DEVICE
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
start=$(date +%s)
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || echo "editable install failed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, specpolicy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if [ -z "${DATA:-}" ] && [ -f .gpu/train.jsonl.gz ]; then
    gunzip -c .gpu/train.jsonl.gz >/tmp/gsm8k-train.jsonl && export DATA=/tmp/gsm8k-train.jsonl
fi
echo "== setup done after $(($(date +%s) - start)) s"

# the runtime's rows compose Hydra configs: without hydra-core / omegaconf (carried as wheels) they cannot run
if { [ -n "${SMOKE:-}" ] || [ "$BENCH_S" -gt 0 ]; } && ! python3 -c "import hydra, omegaconf" 2>/dev/null; then
    echo "== the runtime rows need hydra-core and omegaconf: carry their wheels (and antlr4-python3-runtime) in .whl/; runtime and smoke skipped"
    SMOKE= BENCH_S=0
fi
if [ -n "${SMOKE:-}" ]; then  # the CUDA paths checked for token identity while the drafters train (timings void)
    SMOKE_ARGS=(--device "$DEVICE" --quick --dtype float32 --buckets 1,8,16 --methods eagle3,dflash --batch-size 4
        --batch-repeats 1 --batch-temperature 1 --no-hf --note "correctness smoke beside training: timings void")
    smoke() {
        local modes=(${SMOKE_MODES:-cudagraphs reduce-overhead})
        for mode in "${modes[@]}"; do
            timeout "$((${SMOKE_S:-240} / ${#modes[@]}))" python3 benchmarks/runtime.py "${SMOKE_ARGS[@]}" --cuda-modes "$mode" \
                --out "$OUT/smoke-$mode.json"
            echo "== smoke $mode exit $? after $(($(date +%s) - start)) s"
        done
    }
    smoke >"$OUT/smoke.log" 2>&1 &
    smoke_pid=$!
fi

# two processes, each with its own eager baseline: a compilation that overruns its limit loses
# only its own rows. First the static cache as CUDA graphs (no inductor: seconds to build) with
# HF's rows, then inductor + CUDA graphs (runtime.compile=true's CUDA setting). bench_s=0: not run.
BENCH=(--device "$DEVICE" --num-prompts 10 --max-new-tokens 256 ${QUICK:+--quick} --dtype float32
    --buckets 1,8,16 --methods eagle3,dflash --deadline-s 30 --note "one GPU, alone")
if [ "$BENCH_S" -gt 0 ]; then
    echo "== runtime: CUDA graphs (limit $((BENCH_S * 2 / 5)) s)"
    timeout "$((BENCH_S * 2 / 5))" python3 benchmarks/runtime.py "${BENCH[@]}" --cuda-modes cudagraphs \
        --out "$OUT/runtime-cuda-graphs.json"
    echo "== runtime exit $? after $(($(date +%s) - start)) s"
    echo "== runtime: compiled (limit $((BENCH_S * 3 / 5)) s)"
    timeout "$((BENCH_S * 3 / 5))" python3 benchmarks/runtime.py "${BENCH[@]}" --cuda-modes reduce-overhead --no-hf \
        --out "$OUT/runtime-cuda-compiled.json"
    echo "== runtime exit $? after $(($(date +%s) - start)) s"
fi

if [ "$TRAIN_S" -gt 0 ]; then  # train_s=0: the runtime only
    echo "== training (limit ${TRAIN_S} s)"
    DEADLINE=$(($(date +%s) + TRAIN_S - 15)) timeout "$TRAIN_S" bash benchmarks/gpu_train.sh "$OUT" "$((TRAIN_S - 90))"
    echo "== training exit $? after $(($(date +%s) - start)) s"
fi
# the smoke only: a bare wait would also wait for the tee above, which ends with this script
[ -n "${smoke_pid:-}" ] && wait "$smoke_pid"
ls -la "$OUT"
