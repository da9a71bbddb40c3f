#!/usr/bin/env bash
# Grading on a GPU, inside the sandbox: a correct submission (every lesson hole answered from
# solutions/) and tests/submissions/partly_correct, over the five exercises of the earlier GPU run
# (results/h100/grading/: rungs 9 and 10, notebook 12's two Triton exercises, 15 points), with
# timing. Expected: correct 15/15 with speed ratios near 1.00; partly_correct 0/15 (it hands in
# attention.py alone, so these exercises are stubs).
#
#   usage: tools/gpu_grade_check.sh [OUT]        (default OUT: /tmp/gpu-grade-check)
#   PYTHON=python3 (default). Needs bubblewrap: installed (apt-get install bubblewrap), or
#   BWRAP_DEB=path/to/bubblewrap_*.deb, unpacked under /tmp without installing (for a machine
#   without network: `apt-get download bubblewrap` on one that has it; the .deb files of its
#   libraries beside it are unpacked too when bwrap cannot start without them).
#   Packages installed with `pip install --target /tmp/site` and PYTHONPATH=/tmp/site are bound
#   into the sandbox read-only: it binds the folders on the grader's own sys.path.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
out=${1:-/tmp/gpu-grade-check}
if ! command -v bwrap >/dev/null; then
  if [ -n "${BWRAP_DEB:-}" ]; then
    dpkg -x "$BWRAP_DEB" /tmp/bwrap-deb
    export PATH="/tmp/bwrap-deb/usr/bin:$PATH"
    if ! bwrap --version >/dev/null 2>&1; then  # its libraries too (libcap2, libselinux1, libpcre2-8-0)
      for deb in "$(dirname "$BWRAP_DEB")"/lib*.deb; do dpkg -x "$deb" /tmp/bwrap-deb; done
      export LD_LIBRARY_PATH="/tmp/bwrap-deb/lib/x86_64-linux-gnu:/tmp/bwrap-deb/usr/lib/x86_64-linux-gnu"
    fi
  else
    apt-get install -y -qq bubblewrap >/dev/null
  fi
fi
bwrap --version
rm -rf "$out"
mkdir -p "$out/submissions"
"$python" - "$out/submissions" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, ".")
import course  # noqa: F401,E402  (the runtime first)
from tests.grading_samples import write_correct, write_sample  # noqa: E402

submissions = Path(sys.argv[1])
write_correct(submissions / "correct")
write_sample("partly_correct", submissions, {})
EOF
time "$python" -m course grade "$out/submissions" --out "$out/grades" --seed 271828 --jobs 1 --exercises \
  ladder_k9.tree_attention_kernel ladder_k10.tile_visibility_kernel ladder_k10.tree_attention_kernel \
  triton_attention.online_softmax_step triton_attention.tree_attention_kernel
echo "--- gradebook ($out/grades/gradebook.csv)"
cat "$out/grades/gradebook.csv"
echo "--- feedback of the correct submission"
cat "$out/grades/feedback/correct.md"
