#!/usr/bin/env bash
# CI's simulator sweep: every scenario x {random, pct} with SIM_CI_SCHEDULES schedules in all (default
# 10000, split evenly over the pairs) on one pool of seed threads, one per core; then every pair again
# with prefill pages of 4 tokens and decode pages of 32 (clipped tails in every scenario, READ and WRITE),
# SIM_CI_HETERO_SCHEDULES in all (default 2800), from seed 800000; then every pair with 8 requests, prefill
# pages of 4 and decode pages of 64 (decode short of pages: long waits, leases and lost READs),
# SIM_CI_CROWD_SCHEDULES in all (default 1400), from seed 2500000; then every pair with tensor parallelism 2
# on both sides (equal degrees: each rank maps its own slice), SIM_CI_TP_SCHEDULES in all (default 560), from
# seed 3000000; then every pair with each of the other two micro models (hybrid-micro: Mamba state, READ only;
# llama-micro), SIM_CI_MODEL_SCHEDULES each (default 1120), from seed 4000000; then every pair with async READ
# loads (serving's default since session 20), SIM_CI_ASYNC_SCHEDULES in all (default 1140), from seed 5000000.
# Fails when any run reports a violation;
# prints one line per run and the totals (schedules, distinct, wall time, rate) of each sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
total="${SIM_CI_SCHEDULES:-10000}"
hetero="${SIM_CI_HETERO_SCHEDULES:-2800}"
crowd="${SIM_CI_CROWD_SCHEDULES:-1400}"
tp="${SIM_CI_TP_SCHEDULES:-560}"
models="${SIM_CI_MODEL_SCHEDULES:-1120}"
async="${SIM_CI_ASYNC_SCHEDULES:-1140}"
pairs=$(node --import tsx -e "import('./src/sim/scenarios.ts').then(m => console.log(m.SCENARIOS.length * 2))")
node bin/handoff.mjs sim --scenario all --strategy random,pct --seeds $(( (total + pairs - 1) / pairs ))
node bin/handoff.mjs sim --scenario all --strategy random,pct --seed 800000 --seeds $(( (hetero + pairs - 1) / pairs )) \
  --prefill-block-size 4 --decode-block-size 32
node bin/handoff.mjs sim --scenario all --strategy random,pct --seed 2500000 --seeds $(( (crowd + pairs - 1) / pairs )) \
  --requests 8 --prefill-block-size 4 --decode-block-size 64
node bin/handoff.mjs sim --scenario all --strategy random,pct --seed 3000000 --seeds $(( (tp + pairs - 1) / pairs )) \
  --tensor-parallel-size 2
for model in hybrid-micro llama-micro; do
  node bin/handoff.mjs sim --scenario all --strategy random,pct --seed 4000000 --seeds $(( (models + pairs - 1) / pairs )) \
    --model "$model"
done
node bin/handoff.mjs sim --scenario all --strategy random,pct --seed 5000000 --seeds $(( (async + pairs - 1) / pairs )) \
  --async-read
