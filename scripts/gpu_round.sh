#!/usr/bin/env bash
# The GPU check in one command, for a machine with a GPU and no network (a copy of the working tree):
# python -m ears_core.gpu_check under a hard time limit, every check of it (greedy equality, the device
# round's decisions and runs against today's, the chi-square tests, rollback, the price curve and the
# like-for-like tokens/s), its output and its one JSON file in $OUT, and its exit code as this script's.
#
#   scripts/gpu_round.sh                 # on the GPU machine
#   scripts/gpu_round.sh --device cpu    # the CPU form (small sizes; the test suite runs it)
#
# Arguments go to python -m ears_core.gpu_check (--quick, --synthetic, --speed-only, --space-shapes, --device).
# Environment: OUT (default out/gpu_round), LIMIT (seconds, default 480), PY (default .venv/bin/python
# where there is one, else python3). Nothing is fetched: wheels carried in .whl/ (transformers 5.23.0 where
# the machine has another version; scripts/draft_on_gpu.sh says how to bring them) are installed from
# there alone, into a folder under /tmp.
# Writes $OUT/gpu_check.log (everything it printed), $OUT/gpu_check.json (the report, rewritten after
# every check, so a run stopped at the limit keeps what finished) and $OUT/machine.txt (nvidia-smi's line).
# Exit code: gpu_check's (0 every check held, 1 one failed, 2 no CUDA device), 124 at the time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_round}
LIMIT=${LIMIT:-480}
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  SITE=${SITE:-/tmp/ears_gpu_site}
  if [ ! -d "$SITE" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 3
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
fi
timeout -k 15 "$LIMIT" "$PY" -m ears_core.gpu_check --json "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "gpu_round: stopped at its ${LIMIT} s limit; $OUT/gpu_check.json holds the checks that finished"
fi
exit "$rc"
