#!/usr/bin/env bash
# Parallel tree generation (notebook 20) on a machine with two GPUs: its tests on the GPUs,
# `python -m course generate --parallel`, and the bench of serial against parallel tree generation
# (results/<device>x2/parallel.json and parallel.png). From the repository root:
#
#   tools/gpu_parallel.sh             # everything: tests, generate, the bench (saved); trains the
#                                     # capstone's medium pair first where its weights are missing
#   tools/gpu_parallel.sh --smoke     # a quick pass: a few tests, generate, a 16-token bench of the
#                                     # small pair (not saved)
#   tools/gpu_parallel.sh --no-tests  # the bench alone (when one call must stay under a time limit)
#   tools/gpu_parallel.sh --one-gpu   # also both processes sharing one GPU (gloo); on a machine
#                                     # with one GPU that is all the bench can measure
#
# The machine's Python must hold torch, triton and numba-cuda; extra wheels in .whl/ (see the
# README's "Running on a GPU") are installed into /tmp/site first. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 and friends): the lent two-GPU machine requires it, and the course needs none.
# With $OUT set, the logs, the JSON and the PNG are copied there too.
set -euo pipefail
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
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
{ nvidia-smi -L; python3 -m course info; } 2>&1 | tee "$logs/parallel_info.log"
if [ "$gpus" -lt 2 ] && [[ ! " ${bench_args[*]:-} " == *" --one-gpu "* ]]; then
  echo "this machine has $gpus GPU(s): the bench measures both processes sharing one GPU (--one-gpu)"
  bench_args+=(--one-gpu)
fi

if [ "$tests" = 1 ] && [ "$smoke" = 1 ]; then
  python3 -m pytest -p no:cacheprovider -q -x tests/test_capstone_parallel.py \
    -k "nccl or two_processes or dead_or_frozen or kernels or built_sides" 2>&1 | tee "$logs/parallel_gpu_tests.log"
elif [ "$tests" = 1 ]; then
  python3 -m pytest -p no:cacheprovider -q tests/test_capstone_parallel.py tests/test_pyspec_parallel_tree.py \
    2>&1 | tee "$logs/parallel_gpu_tests.log"
fi

if [ "$tests" = 1 ] && [ "$gpus" -ge 2 ]; then
  python3 -m course generate --parallel --prompt "The old fox " 2>&1 | tee "$logs/parallel_generate.log"
fi

weights=course/capstone/weights
if [ "$smoke" = 0 ] && [ ! -f "$weights/medium_target.safetensors" ]; then
  python3 -m course.capstone.train --pair medium --device cuda --out "$logs/weights" 2>&1 \
    | tee "$logs/parallel_train.log" | tail -3
  cp "$logs"/weights/medium_*.safetensors "$weights"/
fi

if [ "$smoke" = 1 ]; then
  python3 -m course bench capstone parallel --smoke --pair small --out "$logs" "${bench_args[@]}" 2>&1 \
    | tee "$logs/parallel_bench.log"
else
  python3 -m course bench capstone parallel "${bench_args[@]}" 2>&1 | tee "$logs/parallel_bench.log"
  saved=$(sed -n 's/^saved \(.*\) (section parallel)$/\1/p' "$logs/parallel_bench.log" | tail -1)
  if [ -n "$saved" ]; then
    mkdir -p "$(dirname "$saved")/logs"
    cp "$logs"/parallel_*.log "$(dirname "$saved")/logs/"
    cp "$saved" "$(dirname "$saved")/parallel.png" "$logs/"
  fi
fi

if [ -n "${OUT:-}" ]; then
  cp "$logs"/* "$OUT/" 2>/dev/null || true
fi
echo "logs in $logs"
