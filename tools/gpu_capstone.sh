#!/usr/bin/env bash
# The capstone's GPU run in one command, from the repository root of the GPU machine:
#
#   tools/gpu_capstone.sh --smoke   about a minute: the graphed decoders capture, replay and emit what
#                                   the eager ones and plain greedy decoding emit (the committed small pair)
#   tools/gpu_capstone.sh           train the medium pair if its weights are missing (under 2 minutes),
#                                   then the draft-step profile (step_profile.json), the side-by-side
#                                   bench (`python -m course bench capstone`: its sections step_profile,
#                                   then decode, and the figures) and `python -m course generate`; the whole
#                                   run ends within RUN_S seconds (default 540), the bench's budget shrinking
#                                   to what the training left
#   tools/gpu_capstone.sh --train   only the training (TRAIN_ARGS passes more, e.g. "--steps 1500"); copy
#                                   $OUT/weights/* into course/capstone/weights/ and the next plain call
#                                   skips the training and gives the bench the whole RUN_S
#
# Everything lands in $OUT (default ./capstone-gpu): capstone.json, its PNGs and step_profile.json (for
# results/<device>/), capstone_bench.log, step_profile.log and generate.log (for results/<device>/logs/), with
# --smoke capstone_graphs.json and capstone_smoke.log, and, if trained here, weights/
# (medium_*.safetensors and train_medium.log, for course/capstone/weights/). Kernels: solutions/ (COURSE_IMPL), on the GPU (COURSE_SIM=0).
set -u -o pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$PWD/capstone-gpu}
RUN_S=${RUN_S:-540}
export COURSE_SIM=0 COURSE_IMPL=solutions
START=$(date +%s)
mkdir -p "$OUT"
"$PYTHON" -m course info 2>&1 | tee "$OUT/info.log"

if [ "${1:-}" = "--smoke" ]; then
    "$PYTHON" -m course bench capstone graphs --out "$OUT" 2>&1 | tee "$OUT/capstone_smoke.log"
    exit "${PIPESTATUS[0]}"
fi

WEIGHTS=course/capstone/weights
if [ "${1:-}" = "--train" ] || [ ! -f "$WEIGHTS/medium_target.safetensors" ] \
        || [ ! -f "$WEIGHTS/medium_draft.safetensors" ]; then
    echo "== training the medium pair ($(date -u +%T))"
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of options
    "$PYTHON" -m course.capstone.train --pair medium --device cuda --out "$OUT/weights" ${TRAIN_ARGS:-} 2>&1 \
        | tee "$OUT/train_console.log"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then echo "training failed"; exit 1; fi
    cp "$OUT"/weights/medium_*.safetensors "$OUT"/weights/train_medium.log "$WEIGHTS"/
    if [ "${1:-}" = "--train" ]; then echo "== trained in $(( $(date +%s) - START )) s"; exit 0; fi
fi

echo "== draft-step profile ($(date -u +%T), $(( $(date +%s) - START )) s in)"
timeout 120 "$PYTHON" -m course bench capstone step_profile --out "$OUT" --pair medium --modes greedy 2>&1 \
    | grep -v "Warning\|_warn_once" | tee "$OUT/step_profile.log"

echo "== bench ($(date -u +%T), $(( $(date +%s) - START )) s in)"
# The bench stops starting settings 20 s before --until; the timeout is the backstop (its rows so far
# are already in capstone.json, written after each one).
timeout $(( START + RUN_S - 15 - $(date +%s) )) "$PYTHON" -m course bench capstone --out "$OUT" \
    --until $(( START + RUN_S - 45 )) 2>&1 | tee "$OUT/capstone_bench.log"
status=${PIPESTATUS[0]}
"$PYTHON" -m course figures capstone --results "$OUT/capstone.json" 2>&1 | tee -a "$OUT/capstone_bench.log"

LEFT=$(( START + RUN_S - $(date +%s) ))
if [ "$LEFT" -gt 40 ]; then
    echo "== python -m course generate ($LEFT s left)"
    timeout $(( LEFT - 5 )) "$PYTHON" -m course generate --prompt "The old fox " --prompt "12 + 7 = " \
        --impl solutions --no-progress 2>&1 | tee "$OUT/generate.log"
    timeout $(( LEFT - 5 )) "$PYTHON" -m course generate --prompt "The old fox " --prompt "12 + 7 = " \
        --impl solutions --no-progress --mode sample --temperature 0.6 2>&1 | tee -a "$OUT/generate.log"
else
    echo "== no time left for python -m course generate ($LEFT s)"
fi
echo "== done in $(( $(date +%s) - START )) s; results in $OUT"
exit "$status"
