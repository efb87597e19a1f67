#!/usr/bin/env bash
# Draft v2 (issue 15), after `python scripts/draft_data.py sample` has filled assets/draft_data:
# features once (three target layers, so the last-layer and the fused heads read the same cache),
# then heads on nested subsets with one recipe (the saturation curve), then a fused head on all
# the data, each evaluated on the held-out prompts (K = 4 fixed: the head apart from any policy).
# Resumable step by step: a finished head (its training.json) or evaluation (its eval json) is kept.
#
#     nohup bash scripts/draft_v2.sh > /tmp/draft_v2.log 2>&1 &
#
# Outputs in $OUT (default /tmp/draft_v2): head-<positions>/, head-fused/, eval-*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/draft_v2}
EPOCHS=${EPOCHS:-2}
SIZES=${SIZES-"80000 250000 500000 all"}  # SIZES="" trains only the fused head on all the data
CURVE=${CURVE:-}  # e.g. 110: the learning curve every 110 steps (training.json)
FEATS=${FEATS:-$HOME/.cache/ears_studio/draft_features/L3-15-last}
mkdir -p "$OUT"
rm -f /tmp/ears_quiet
$PY scripts/draft_data.py features --layers 3,15,last --threads 2 --nice 0 --minutes 600

evaluate() {  # $1 head folder, $2 eval json
  [ -f "$2" ] || $PY scripts/eval_draft.py --draft "$1" --quick --no-speed --prompts 16 --max-new-tokens 64 --k 4 --json "$2"
}
for n in $SIZES; do
  head="$OUT/head-$n"
  pos=$([ "$n" = all ] && echo "" || echo "--positions $n")
  [ -f "$head/training.json" ] || $PY scripts/train_draft.py --features "$FEATS" $pos --epochs "$EPOCHS" \
      --minutes 600 --out "$head"
  evaluate "$head" "$OUT/eval-$n.json"
done
head="$OUT/head-fused"
[ -f "$head/training.json" ] || $PY scripts/train_draft.py --features "$FEATS" --fused --epochs "$EPOCHS" \
    --minutes 600 ${CURVE:+--curve-every "$CURVE"} --out "$head"
evaluate "$head" "$OUT/eval-fused.json"
echo "draft head: done"
