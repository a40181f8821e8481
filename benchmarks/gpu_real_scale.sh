#!/usr/bin/env bash
# Speedups at real scale on a lent CUDA machine (issue 48 item 6), one command, results under $OUT:
#   1. runs of the bundled family to replay (unless carried in .gpu/runs/<method>/ or RUNS="dir ..."):
#      python -m specpolicy method=<m> on the device, float32, a few prompts -> $RUNS_DIR/<m>/ (default $OUT/runs);
#      make them on a CPU beforehand to spare device minutes (they travel in .gpu/runs/):
#        DEVICE=cpu RUNS_DIR=.gpu/runs OUT=/tmp/rs-runs bash benchmarks/gpu_real_scale.sh 3600 0 0 0 0
#   2. profile: random-init models at the published shapes (Qwen2.5-7B, Qwen3-8B, Llama-3.1-8B,
#      Qwen2.5-32B; Fast-dLLM v2 1.5B, DFlash, EAGLE-3, DART, Falcon, DEER 0.5B), bfloat16, eager and
#      CUDA graphs, ms per pass by width and KV length -> $OUT/profile/h200-<target>.{json,yaml};
#   3. replay: the runs' passes executed on the real-size Qwen2.5-7B target and drafters, and looked up
#      in the measured Qwen2.5-7B table, REPLAYED beside MODELED -> $OUT/replay-{executed,profile}.{json,md};
#   4. host work per round beside the device's passes (issue 48 item 5): the neighbours table's methods on
#      the bundled family, float32, and the after-pass probe -> $OUT/host-work-<device>.json
#      (benchmarks/host_work.py; on a CPU the passes evict the host's caches, on a GPU they should not:
#      the probe there says); then the heaviest host calls' time in the run against warm replays
#      (host_work.py --warm-split: DART's search, the CPS beams and lattice, the tree inputs) ->
#      $OUT/host-work-warm-split-<device>.json (last: a run cut at the command's limit loses it first).
# Each part has its own time limit (and a --deadline-s inside it), so one that overruns leaves the others'.
#
# Usage, from the repository root on the CUDA machine (about 9 minutes with the defaults):
#   OUT=/tmp/rs-out bash benchmarks/gpu_real_scale.sh [runs_s=90] [profile_s=210] [replay_s=120] [host_s=120] [split_s=30]
# A CPU dry run at tiny shapes (2 layers, width 64, vocab 512, widths 1,4, KV 16,64; host work: one
# method, one prompt, 8 new tokens):
#   DEVICE=cpu TINY=1 NO_WHEELS=1 OUT=/tmp/rs-dry bash benchmarks/gpu_real_scale.sh 120 120 60 60 60
# METHODS: the presets replayed; PROMPTS / TOKENS: the runs' size; TARGETS / GRAPH_TARGETS: the targets
# profiled eager (default all four) / also with CUDA graphs (default qwen2.5-7b,llama-3.1-8b).
set -u
OUT=${OUT:-/tmp/rs-out}
RUNS_S=${1:-90}
PROFILE_S=${2:-210}
REPLAY_S=${3:-120}
HOST_S=${4:-120}
SPLIT_S=${5:-30}
DEVICE=${DEVICE:-cuda}
METHODS=${METHODS:-"fastdllm+failfast dflash+failfast eagle3+static-k5 eagle3+goodput eagle3+eagle2-tree dart+dart-tree falcon+failfast deer+failfast"}
PROMPTS=${PROMPTS:-3}
TOKENS=${TOKENS:-128}
RUNS_DIR=${RUNS_DIR:-$OUT/runs}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/real-scale.log") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
start=$(date +%s)
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if [ -n "${TINY:-}" ]; then
    SIZE=(--tiny --widths 1,4 --kv 16,64 --warmup 1 --repeats 2)
    REPLAY_SIZE=(--tiny --warmup 1 --repeats 2 --max-rounds 8)
    HOST_SIZE=(--method ar-k5 --num-prompts 1 --max-new-tokens 8 --repeat 1)
    SPLIT_SIZE=(--method dart+dart-tree --num-prompts 1 --max-new-tokens 8)
    PROMPTS=${TINY_PROMPTS:-1} TOKENS=${TINY_TOKENS:-16} METHODS=${TINY_METHODS:-"eagle3+static-k5 fastdllm+failfast"}
else
    SIZE=()
    REPLAY_SIZE=(--max-rounds 96)
    HOST_SIZE=(--neighbours --num-prompts 2 --max-new-tokens 48 --repeat 1)
    SPLIT_SIZE=(--method dflash+dart-tree --method diffuspec-fastdllm --method eagle3+eagle2-tree --num-prompts 2
        --max-new-tokens 48)
fi
elapsed() { echo "$(($(date +%s) - start)) s"; }

# 1. the runs to replay
runs=()
if [ -n "${RUNS:-}" ]; then
    runs=($RUNS)
elif [ "$RUNS_DIR" != .gpu/runs ] && compgen -G ".gpu/runs/*/results.jsonl" >/dev/null; then
    for f in .gpu/runs/*/results.jsonl; do runs+=("$(dirname "$f")"); done
elif [ "$RUNS_S" -gt 0 ] && python3 -c "import hydra, omegaconf" 2>/dev/null; then
    echo "== runs of the bundled family (limit ${RUNS_S} s): $METHODS"
    n=$(echo $METHODS | wc -w)
    for m in $METHODS; do
        timeout "$((RUNS_S / n))" python3 -m specpolicy "method=$m" "dataset.num_prompts=$PROMPTS" \
            "generation.max_new_tokens=$TOKENS" runtime.device="$DEVICE" runtime.dtype=float32 run.vanilla_baseline=false \
            run.warmup_prompts=0 "hydra.run.dir=$RUNS_DIR/$m" >"$OUT/runs-$m.log" 2>&1
        echo "== run $m exit $? after $(elapsed)"
        [ -f "$RUNS_DIR/$m/results.jsonl" ] && runs+=("$RUNS_DIR/$m")
    done
else
    echo "== no runs to replay: carry .gpu/runs/<method>/ (results.jsonl, summary.json) or hydra-core/omegaconf wheels"
fi

# 2. the profiles: every target and drafter on the eager runtime, then the CUDA-graph runtime for
#    GRAPH_TARGETS (dynamo traces each bucket: tens of seconds a model), cells merged into the same tables
if [ "$PROFILE_S" -gt 0 ]; then
    eager_s=$((PROFILE_S * 3 / 5)) graphs_s=$((PROFILE_S - PROFILE_S * 3 / 5))
    echo "== profile, eager (limit ${eager_s} s)"
    timeout "$eager_s" python3 benchmarks/real_scale.py profile --device "$DEVICE" "${SIZE[@]}" --modes eager \
        ${TARGETS:+--targets "$TARGETS"} --deadline-s "$((eager_s - 20))" --out "$OUT/profile"
    echo "== profile exit $? after $(elapsed)"
    echo "== profile, CUDA graphs (limit ${graphs_s} s)"
    timeout "$graphs_s" python3 benchmarks/real_scale.py profile --device "$DEVICE" "${SIZE[@]}" --modes graphs \
        --targets "${GRAPH_TARGETS:-qwen2.5-7b,llama-3.1-8b}" --deadline-s "$((graphs_s - 20))" --out "$OUT/profile"
    echo "== profile exit $? after $(elapsed)"
fi

# 3. the replay: executed at real scale, then looked up in the measured table of the same target
if [ "$REPLAY_S" -gt 0 ] && [ "${#runs[@]}" -gt 0 ]; then
    table=$(ls "$OUT"/profile/*-qwen2.5-7b.json 2>/dev/null | head -1)
    echo "== replay, executed (limit $((REPLAY_S * 4 / 5)) s): ${runs[*]}"
    timeout "$((REPLAY_S * 4 / 5))" python3 benchmarks/real_scale.py replay "${runs[@]}" --device "$DEVICE" \
        "${REPLAY_SIZE[@]}" ${table:+--measured-table "$table"} --deadline-s "$((REPLAY_S * 4 / 5 - 20))" \
        --out "$OUT/replay-executed.json"
    echo "== replay exit $? after $(elapsed)"
    if [ -n "$table" ]; then
        timeout "$((REPLAY_S / 5))" python3 benchmarks/real_scale.py replay "${runs[@]}" --device "$DEVICE" \
            "${REPLAY_SIZE[@]}" --from-profile "$table" --mode graphs --out "$OUT/replay-profile.json"
        echo "== replay from $table exit $? after $(elapsed)"
    fi
fi
# 4. host work per round on this device (the bundled family, float32), with the after-pass probe
if [ "$HOST_S" -gt 0 ]; then
    echo "== host work (limit ${HOST_S} s)"
    timeout "$HOST_S" python3 benchmarks/host_work.py --device "$DEVICE" --dtype float32 "${HOST_SIZE[@]}" \
        --deadline-s "$((HOST_S - 30))" --out "$OUT/host-work-$DEVICE.json"
    echo "== host work exit $? after $(elapsed)"
fi
if [ "$SPLIT_S" -gt 0 ]; then
    echo "== host calls, in the run and warm (limit ${SPLIT_S} s)"
    timeout "$SPLIT_S" python3 benchmarks/host_work.py --device "$DEVICE" --dtype float32 "${SPLIT_SIZE[@]}" \
        --warm-split specpolicy.policies.dart_tree:_run --warm-split specpolicy.core.path_search:_finish_kneser_ney \
        --warm-split specpolicy.core.path_search_kernels:lattice_topk \
        --warm-split specpolicy.core.path_search_kernels:lattice_rows \
        --warm-split specpolicy.core.compiled_tree:tree_inputs --out "$OUT/host-work-warm-split-$DEVICE.json"
    echo "== host calls exit $? after $(elapsed)"
fi
ls -laR "$OUT" | grep -v '^total'
