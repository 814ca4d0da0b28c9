#!/usr/bin/env bash
# Recipe arms at a fixed number of steps: one change at a time against the default,
# the same seed, compared on validation BLEU (all 500 sentences, greedy) and perplexity.
# A fixed step count makes the comparison independent of machine load (wall-clock
# budgets are not: a busy machine makes fewer steps). Arms already finished (their run
# folder has best.json) are skipped, so the script can be restarted; the table is
# printed at the end (python scripts/arms_table.py OUT).
#
#   STEPS=2000 OUT=runs/arms CACHE=~/.cache/minitf bash scripts/recipe_arms.sh [ARM ...]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
EVAL_EVERY=${EVAL_EVERY:-500}
OUT=${OUT:-runs/arms}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/minitf}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
# name: the flags of each arm; all but the lexicon arms train on whole sentences only (--lexicon 0),
# the recipe the arms were measured against (docs/results.md)
declare -A ARMS=(
  [sentences]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1"
  [phrases]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --phrases"
  [bpe-dropout-0.1]="--preset tiny --lexicon 0 --bpe-dropout 0.1 --dropout 0.1"
  [dropout-0.2]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.2"
  [dropout-0.3]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.3"
  [label-smoothing-0.2]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --label-smoothing 0.2"
  [lr-scale-2]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --lr-scale 2"
  [lr-scale-0.5]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --lr-scale 0.5"
  [warmup-400]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --warmup 400"
  [dropout-0]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0"
  [vocab-2000]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --vocab-size 2000"
  [vocab-8000]="--preset tiny --lexicon 0 --bpe-dropout 0 --dropout 0.1 --vocab-size 8000"
  [lexicon-0.5]="--preset tiny --bpe-dropout 0 --dropout 0.1 --lexicon 0.5"
  [lexicon-2]="--preset tiny --bpe-dropout 0 --dropout 0.1 --lexicon 2"
)
ORDER=(sentences phrases bpe-dropout-0.1 dropout-0.2 dropout-0.3 label-smoothing-0.2 lr-scale-2 lr-scale-0.5 warmup-400 dropout-0 vocab-2000 vocab-8000 lexicon-0.5 lexicon-2)
[ $# -gt 0 ] && ORDER=("$@")
for arm in "${ORDER[@]}"; do
  run="$OUT/$arm"
  if [ -f "$run/best.json" ]; then echo "== $arm: done already"; continue; fi
  rm -rf "$run"
  echo "== $arm: $PYTHON train.py ${ARMS[$arm]} --max-steps $STEPS --seed 1 (started $(date +%T))"
  # shellcheck disable=SC2086
  "$PYTHON" train.py ${ARMS[$arm]} --max-steps "$STEPS" --seed 1 --eval-every "$EVAL_EVERY" \
      --bleu-sentences 500 --no-progress --cache-dir "$CACHE" --out "$run" > "$OUT/$arm.log" 2>&1 \
      || echo "== $arm failed, see $OUT/$arm.log"
done
"$PYTHON" scripts/arms_table.py "$OUT" "${ORDER[@]}"
