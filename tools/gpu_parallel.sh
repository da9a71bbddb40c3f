#!/usr/bin/env bash
# Parallel tree generation (notebook 20) on a machine with two GPUs, in under 10 minutes: trains the
# capstone's medium pair where its weights are missing, runs the bench of serial against parallel
# tree generation (results/<device>x2/parallel.json and parallel.png), then the GPU tests of the
# parallel workers and `python -m course generate --parallel`. From the repository root:
#
#   tools/gpu_parallel.sh             # everything (the bench's results saved)
#   tools/gpu_parallel.sh --smoke     # a quick pass: a few tests, generate, a 16-token bench of the
#                                     # small pair (not saved)
#   tools/gpu_parallel.sh --no-tests  # the bench alone
#   tools/gpu_parallel.sh --one-gpu   # also both processes sharing one GPU (gloo); on a machine
#                                     # with one GPU that is all the bench can measure
#
# The machine's Python must hold torch, triton and numba-cuda; extra wheels in .whl/ (see the
# README's "Running on a GPU") are installed into /tmp/site first. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 and friends): the lent two-GPU machine requires it, and the course needs none.
# Each stage has its own time limit, so that one stuck stage leaves the others their time. With
# $OUT set, parallel.json, parallel.png and logs.tar.gz (every log) are copied there: three files.
set -uo pipefail
cd "$(dirname "$0")/.."

smoke=0
tests=1
bench_args=()
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    --no-tests) tests=0 ;;
    --one-gpu) bench_args+=(--one-gpu) ;;
    *) bench_args+=("$arg") ;;
  esac
done

if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export COURSE_SIM=0 COURSE_IMPL=solutions PYTHONUNBUFFERED=1

logs=$(mktemp -d)
deadline=${GPU_PARALLEL_BUDGET:-570}  # seconds from the script's start ($SECONDS): under 10 minutes in all
stage() {  # stage NAME SECONDS COMMAND...: run it under a time limit, log it, note how it ended
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS left=$((deadline - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo "stage $name: skipped, the script's time is spent" | tee -a "$logs/parallel_stages.log"
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/parallel_$name.log"
  local rc=${PIPESTATUS[0]}
  echo "stage $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$logs/parallel_stages.log"
}

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" || echo 0)
stage info 60 bash -c 'nvidia-smi -L; python3 -m course info'
if [ "$gpus" -lt 2 ] && [[ ! " ${bench_args[*]:-} " == *" --one-gpu "* ]]; then
  echo "this machine has $gpus GPU(s): the bench measures both processes sharing one GPU (--one-gpu)"
  bench_args+=(--one-gpu)
fi

weights=course/capstone/weights
if [ "$smoke" = 0 ] && [ ! -f "$weights/medium_target.safetensors" ]; then
  stage train 150 python3 -m course.capstone.train --pair medium --device cuda --out "$logs/weights"
  cp "$logs"/weights/medium_*.safetensors "$weights"/ && rm -rf "$logs/weights"
fi

bench=(python3 -m course bench capstone parallel)
saved=""
if [ "$smoke" = 1 ]; then
  stage bench 200 "${bench[@]}" --smoke --pair small --out "$logs" "${bench_args[@]}"
else
  stage bench 400 "${bench[@]}" "${bench_args[@]}"
  saved=$(sed -n 's/^saved \(.*\) (section parallel)$/\1/p' "$logs/parallel_bench.log" | tail -1)
fi

if [ "$tests" = 1 ] && [ "$smoke" = 1 ]; then
  stage gpu_tests 120 python3 -m pytest -p no:cacheprovider -q -x tests/test_capstone_parallel.py \
    -k "nccl or two_processes or dead_or_frozen or kernels or built_sides"
elif [ "$tests" = 1 ]; then
  # the GPU tests of the workers (the specification's tests run on the CPU, in CI); -x: a failure's
  # traceback is printed at once, not in a summary that a stage cut short by its limit never reaches
  stage gpu_tests 240 python3 -m pytest -p no:cacheprovider -q -x tests/test_capstone_parallel.py \
    tests/test_capstone_device_tree.py tests/test_capstone_side_steps.py tests/test_capstone_queued.py
fi
if [ "$tests" = 1 ] && [ "$gpus" -ge 2 ]; then
  stage generate 60 python3 -m course generate --parallel --prompt "The old fox "
fi

if [ -n "$saved" ] && [ -f "$saved" ]; then
  mkdir -p "$(dirname "$saved")/logs"
  cp "$logs"/parallel_*.log "$(dirname "$saved")/logs/"
  cp "$saved" "$(dirname "$saved")/parallel.png" "$logs/"
fi
tar -C "$logs" -czf "$logs/logs.tar.gz" $(cd "$logs" && ls parallel_*.log)
if [ -n "${OUT:-}" ]; then
  for f in parallel.json parallel.png logs.tar.gz; do
    [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"
  done
fi
cat "$logs/parallel_stages.log"
echo "logs in $logs"
