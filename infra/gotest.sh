#!/usr/bin/env bash
# Runs go test -v with the given arguments, printing one line per test and
# subtest (the processor suite's subtests are named by broker: /kfake,
# /kafka) and go test's closing lines; on failure, also the output before
# each failing test. The full log is kept in $GOTEST_LOG (default
# ${TMPDIR:-/tmp}/onceflow-test.log).
set -uo pipefail
log=${GOTEST_LOG:-${TMPDIR:-/tmp}/onceflow-test.log}
go test -v "$@" >"$log" 2>&1
rc=$?
grep -E '^\s*--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)([[:space:]]|$)|^panic:|^-test.shuffle' "$log"
if [ "$rc" -ne 0 ]; then
  echo "== output before each failure (full log: $log)"
  grep -v '^time=' "$log" | grep -B 40 -E -- '--- FAIL|^panic:|\[build failed\]|\[setup failed\]' | tail -400
fi
exit "$rc"
