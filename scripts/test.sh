#!/usr/bin/env bash
# The one test command (README, CI): type check, then every *.test.ts through node:test.
# Fails when any test fails and when no test file is found (never "green with zero tests").
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s globstar nullglob
echo "== type check"
npx tsc -p tsconfig.json
echo "== format check (prettier)"
npx prettier --check "src/**/*.{ts,mjs}" "test/**/*.ts" "bin/*.mjs" > /dev/null || { npx prettier --check "src/**/*.{ts,mjs}" "test/**/*.ts" "bin/*.mjs"; echo "run: npm run format" >&2; exit 1; }
files=(src/**/*.test.ts test/**/*.test.ts)
if [ "${#files[@]}" -eq 0 ]; then
  echo "no test files found" >&2
  exit 1
fi
echo "== ${#files[@]} test files"
# --test-concurrency=2: two cores on CI; files that start servers pick free ports. --test-force-exit: a
# file whose tests are done exits even if a failed test left a server or timer behind (session 19: a
# setup assertion that failed before its try/finally kept frozen_member.test.ts's proxy checking health
# for ever, and CI waited on it); --test-timeout: a test still running after 10 minutes fails.
node --import tsx --test --test-reporter=spec --test-concurrency=2 --test-force-exit --test-timeout=600000 \
  "${files[@]}" 2>&1 | tee .test-output.log
status=${PIPESTATUS[0]}
if ! grep -Eq '^ℹ pass [1-9]' .test-output.log; then
  echo "no test passed: treating as failure" >&2
  exit 1
fi
exit "$status"
