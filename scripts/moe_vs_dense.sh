#!/usr/bin/env bash
# A mixture of experts against the dense model of equal active parameters, each trained from scratch on the
# default text (train.py --model llama: the World English Bible, its tiny preset) for the same wall minutes
# (--max-minutes: the whole command, validations included), with the same seed, one after the other; then the
# figure of both (scripts/make_figures.py --moe-runs): validation loss against minutes, and the sparse run's
# expert load (each expert's share of the routed tokens, per layer) against step.
#
#   MINUTES=30 OUT=runs/moe-vs-dense bash scripts/moe_vs_dense.sh [more train.py flags, given to both runs]
#
# The sparse run: EXPERTS (8) SwiGLU experts of width EXPERT_D_FF (256) in every block, PER_TOKEN (2) per token
# (--num-experts, --moe-d-ff, --experts-per-token; the load-balancing loss at its default coefficient). The dense
# run: one SwiGLU of width PER_TOKEN x EXPERT_D_FF (512: the tiny preset's own d_ff) in every block, so that a
# token meets as many feed-forward parameters in both (the router's d_model x EXPERTS aside). Everything else is
# the preset's, and the same in both. Flags after the script's name go to both runs (after the script's own, so
# they win): --train-text FILE --valid-text FILE to train on another text, --d-model, --num-layers, ...
# Each run's folder is OUT/sparse and OUT/dense, its log OUT/sparse.log and OUT/dense.log; a run whose folder has
# best.json already (it ended) is not run again, so the script can be restarted after one run. The figure goes to
# FIGURES/moe_vs_dense.png (FIGURES: OUT unless given; docs/figures for the docs' picture).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-30}
OUT=${OUT:-runs/moe-vs-dense}
FIGURES=${FIGURES:-$OUT}
SEED=${SEED:-1}
EXPERTS=${EXPERTS:-8}
PER_TOKEN=${PER_TOKEN:-2}
EXPERT_D_FF=${EXPERT_D_FF:-256}
EVAL_EVERY=${EVAL_EVERY:-100}
PYTHON=${PYTHON:-python}
DENSE_D_FF=$((PER_TOKEN * EXPERT_D_FF))
mkdir -p "$OUT"
declare -A ARMS=(
  [dense]="--d-ff $DENSE_D_FF"
  [sparse]="--d-ff $DENSE_D_FF --num-experts $EXPERTS --experts-per-token $PER_TOKEN --moe-d-ff $EXPERT_D_FF"
)
for arm in dense sparse; do
  run="$OUT/$arm"
  if [ -f "$run/best.json" ]; then echo "== $arm: done already ($run)"; continue; fi
  echo "== $arm: $PYTHON train.py --model llama ${ARMS[$arm]} --max-minutes $MINUTES --seed $SEED" \
       "--eval-every $EVAL_EVERY $* (started $(date +%T))"
  # shellcheck disable=SC2086
  "$PYTHON" train.py --model llama ${ARMS[$arm]} --max-minutes "$MINUTES" --seed "$SEED" \
      --eval-every "$EVAL_EVERY" --no-progress --out "$run" "$@" > "$OUT/$arm.log" 2>&1 \
      || { echo "== $arm failed, see $OUT/$arm.log" >&2; tail -n 3 "$OUT/$arm.log" >&2; exit 1; }
  grep -E "^(trained|test loss)" "$OUT/$arm.log" || true
done
"$PYTHON" scripts/make_figures.py --moe-runs "$OUT/sparse" "$OUT/dense" --out "$FIGURES"
