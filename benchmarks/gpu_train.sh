#!/usr/bin/env bash
# The family drafters retrained on one CUDA device within a wall-clock budget:
# distill (the target's greedy continuations of GSM8K train) + features (the target's hidden
# states) on the device, then three trainings in parallel, each a separate process with its own
# --out (so their training_log.json files do not collide) and OMP_NUM_THREADS=4 (TRAIN_THREADS):
#   * dflash-drafter, continued from the bundled one (--dflash-init; it keeps its draft vocabulary),
#   * dart-drafter, continued from the bundled one (--dart-init; the int8 weights are dequantised on load),
#   * deer-drafter, a fresh LoRA on the bundled dllm-drafter (two stages; the budget split 2:1 as their steps).
# Each training's loop gets BUDGET_S seconds (TrainConfig.max_seconds: the step plan is cut after 20
# timed steps, the LR schedule recomputed over the cut plan). Step plans are set far beyond what
# fits, so the budget decides; the steps run are in each training_log.json (rerun with
# --*-max-steps = steps to reproduce).
#
# Usage:  bash benchmarks/gpu_train.sh OUT [BUDGET_S=240]
# Env:    DEVICE (cuda; cpu for a dry run), DEADLINE (epoch seconds by which the weights must be
#         saved: the budget shrinks to fit after distill + features), DATA (GSM8K train jsonl; it must be on the machine:
#         carry it in an ignored folder of the checkout), SCRATCH (work dir, default a mktemp dir),
#         TINY=1 (a CPU smoke run: 40 rows, 32 new tokens, small batches), LIMIT_ROWS,
#         JOBS (the trainings to run, default "dflash dart deer"; also deer-cont: the bundled DEER LoRA
#         continued through both stages, and dflash-lN: a fresh DFlash drafter of N decoder layers at
#         DFLASH_FRESH_LR (default 2e-3), stored int8, given its draft vocabulary after training),
#         DFLASH_LR (the DFlash continuation's peak rate, default 1e-3), DART_INIT (the DART checkpoint
#         continued, default the bundled one),
#         DISTILL (the target's greedy continuations carried in, gzipped jsonl as the pipeline's
#         work/distill/target_greedy.jsonl; default .gpu/distill.jsonl.gz when present): the device then
#         skips its own distillation (about 130 s on an H200) and computes only the features.
# Output: OUT/gpu-weights.tar (<job>-drafter/ and <job>-training_log.json for each job),
#         OUT/{prepare,<job>}.log (the distill + features log in the tar).
set -euo pipefail

OUT=$(realpath -m "${1:?usage: gpu_train.sh OUT [BUDGET_S]}")
BUDGET=${2:-240}
DEVICE=${DEVICE:-cuda}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${DATA:-}" ]]; then
  for d in .gpu/train.jsonl /work/shared/data/gsm8k/train.jsonl; do
    [[ -f $d ]] && DATA=$d && break
  done
fi
[[ -f "${DATA:-}" ]] || { echo "error: DATA=${DATA:-} (GSM8K train jsonl) not found" >&2; exit 2; }
DATA=$(realpath "$DATA")
JOBS=${JOBS:-dflash dart deer}
for job in $JOBS; do
  case $job in dflash | dart | deer | deer-cont | dflash-l[1-9]) ;; *) echo "error: JOBS has '$job' (accepted: dflash, dart, deer, deer-cont, dflash-l1 .. dflash-l9)" >&2; exit 2 ;; esac
done
S=${SCRATCH:-$(mktemp -d /tmp/gpu-train.XXXXXX)}
mkdir -p "$OUT" "$S"
echo "gpu_train: OUT=$OUT budget=${BUDGET}s device=$DEVICE data=$DATA scratch=$S jobs=$JOBS"

if [[ "${TINY:-0}" == 1 ]]; then  # the CPU dry run: same paths, tiny sizes
  PREP=(--limit-rows "${LIMIT_ROWS:-40}" --distill-prompts "${LIMIT_ROWS:-40}" --distill-max-new 32
    --distill-batch 16 --feature-batch-tokens 4096)
  COMMON=(--limit-rows "${LIMIT_ROWS:-40}" --holdout 8 --log-every 5)
  DFLASH=(--dflash-batch-tokens 2048 --dflash-epochs 50)
  DART=(--dart-batch-tokens 1024 --dart-epochs 50 --dart-max-steps 100000)
  DEER="--heldout 8 --batch-tokens 2048 --stage1-steps 2000 --stage2-steps 1000 --checkpoint-every 10"
else  # the GPU run: every GSM8K train prompt x 256 new tokens; 4x the CPU batches, the CPU learning rates
  PREP=(--distill-batch 1024 --distill-max-new 256 --feature-batch-tokens 65536)
  COMMON=(--log-every 20)
  DFLASH=(--dflash-batch-tokens 16384 --dflash-epochs 100)
  DART=(--dart-batch-tokens 16384 --dart-epochs 100 --dart-max-steps 1000000)
  DEER="--batch-tokens 16384 --stage1-steps 100000 --stage2-steps 50000 --checkpoint-every 200"
fi
# the bundled drafters' own recipes (training_log.json of the bundle), kept for the continuation:
# DFlash lr 1e-3 (pipeline default 2e-3), warmup 100, gamma 5, extension probs 0.8/0.12/0.05/0.03;
# DART lr 2e-3, warmup 30 (the defaults); DEER lr 2e-3 / 1e-3 (the defaults), stage II alpha 1.03
DFLASH+=(--dflash-lr "${DFLASH_LR:-1e-3}" --dflash-warmup 100 --dflash-gamma 5 --dflash-extension-probs 0.8 0.12 0.05 0.03)
DEER="$DEER --alpha 1.03"

# the bundle, symlinks resolved (a device run starts from a bare copy of the checkout)
rm -rf "$S/bundle" && cp -rL specpolicy/family/bundle "$S/bundle"
prep_out() {  # a pipeline --out holding the bundle's tokenizer, target and dllm-drafter
  mkdir -p "$1"
  for m in tokenizer target dllm-drafter; do rm -rf "${1:?}/$m" && cp -r "$S/bundle/$m" "$1/$m"; done
}
prep_out "$S/prep"
DISTILL=${DISTILL:-}
[[ -z $DISTILL && -f .gpu/distill.jsonl.gz ]] && DISTILL=.gpu/distill.jsonl.gz
if [[ -n $DISTILL ]]; then  # a carried distillation: the distill stage finds its output and is skipped
  mkdir -p "$S/work/distill"
  gunzip -c "$DISTILL" >"$S/work/distill/target_greedy.jsonl"
  echo "gpu_train: distillation carried in ($DISTILL, $(wc -l <"$S/work/distill/target_greedy.jsonl") rows)"
fi
t0=$(date +%s)
OMP_NUM_THREADS=${PREP_THREADS:-8} "${PYTHON:-python3}" -m specpolicy.family --device "$DEVICE" --data "$DATA" \
  --out "$S/prep" --work "$S/work" --stages distill features --distill-top-k 0 "${PREP[@]}" \
  "${COMMON[@]}" >"$OUT/prepare.log" 2>&1 || { tail -30 "$OUT/prepare.log" >&2; exit 1; }
echo "gpu_train: distill + features $(($(date +%s) - t0))s"
mkdir -p "$S/tar" && cp "$S/prep/training_log.json" "$S/tar/prepare-training_log.json"

for job in $JOBS; do prep_out "$S/$job"; done
if [[ -n "${DEADLINE:-}" ]]; then  # an epoch second by which the weights must be saved: shrink the budget
  left=$(( (DEADLINE - $(date +%s) - 20) * 10 / 11 ))  # the trainer's hard stop is 1.1 x the budget
  (( left < BUDGET )) && BUDGET=$left && echo "gpu_train: budget cut to ${BUDGET}s by DEADLINE"
  (( BUDGET < 30 )) && { echo "error: DEADLINE leaves ${BUDGET}s of training" >&2; exit 3; }
fi
t1=$(date +%s)
for job in $JOBS; do : >"$OUT/$job.log"; done  # each job's log, its stages appended in turn
run_stage() {  # job stage extra-args...
  local job=$1 stage=$2
  shift 2
  OMP_NUM_THREADS=${TRAIN_THREADS:-4} "${PYTHON:-python3}" -m specpolicy.family --device "$DEVICE" --data "$DATA" --out "$S/$job" \
    --work "$S/work" --stages "$stage" --max-seconds-per-stage "$BUDGET" "${COMMON[@]}" "$@" \
    >>"$OUT/$job.log" 2>&1
}
pids=()
for job in $JOBS; do
  case $job in
    dflash) run_stage dflash dflash-drafter "${DFLASH[@]}" --dflash-init "$S/bundle/dflash-drafter" & ;;
    dart) run_stage dart dart-drafter "${DART[@]}" --dart-init "${DART_INIT:-$S/bundle/dart-drafter}" & ;;
    deer) run_stage deer deer-drafter --deer-args "--base dllm-drafter $DEER" & ;;
    deer-cont) run_stage deer-cont deer-drafter --deer-args "--base dllm-drafter --init $S/bundle/deer-drafter $DEER" & ;;
    dflash-l*) # a fresh drafter: the bundled recipe's DFlash settings at its own peak rate, then its draft vocabulary
      (run_stage "$job" dflash-drafter "${DFLASH[@]}" --dflash-lr "${DFLASH_FRESH_LR:-2e-3}" \
        --dflash-layers "${job#dflash-l}" --dflash-int8 && run_stage "$job" dflash-vocabulary) & ;;
  esac
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "gpu_train: trainings $(($(date +%s) - t1))s (rc $rc)"

mkdir -p "$S/tar"
for job in $JOBS; do
  stage=${job%%-*}-drafter
  [[ -d "$S/$job/$stage" ]] && cp -r "$S/$job/$stage" "$S/tar/$job-drafter"
  [[ -f "$S/$job/training_log.json" ]] && cp "$S/$job/training_log.json" "$S/tar/$job-training_log.json"
  tail -5 "$OUT/$job.log" || true
done
tar -cf "$OUT/gpu-weights.tar" -C "$S/tar" .
ls -la "$OUT"
exit $rc
