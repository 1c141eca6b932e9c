#!/usr/bin/env bash
# CI's simulator sweep: every scenario x {random, pct}, SIM_CI_SEEDS seeds each (default 720: >= 10^4
# schedules in all) on one pool of seed threads, one per core. Fails when any run reports a violation;
# prints one line per run and the totals (schedules, distinct, wall time, schedules/s).
set -euo pipefail
cd "$(dirname "$0")/.."
exec node bin/handoff.mjs sim --scenario all --strategy random,pct --seeds "${SIM_CI_SEEDS:-720}"
