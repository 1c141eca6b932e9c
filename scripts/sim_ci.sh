#!/usr/bin/env bash
# CI's simulator sweep: every scenario x {random, pct} with SIM_CI_SCHEDULES schedules in all (default
# 10000, split evenly over the pairs) on one pool of seed threads, one per core. Fails when any run
# reports a violation; prints one line per run and the totals (schedules, distinct, wall time, rate).
set -euo pipefail
cd "$(dirname "$0")/.."
total="${SIM_CI_SCHEDULES:-10000}"
pairs=$(node --import tsx -e "import('./src/sim/scenarios.ts').then(m => console.log(m.SCENARIOS.length * 2))")
exec node bin/handoff.mjs sim --scenario all --strategy random,pct --seeds $(( (total + pairs - 1) / pairs ))
