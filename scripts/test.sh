#!/usr/bin/env bash
# The whole test suite, as CI runs it: the same tests as `.venv/bin/pytest -q`, in two processes at once. The unit
# tests (~80 s of one core) run beside the integration tests (one torch thread per process, in file order, one at a
# time: two integration files at once interfere through in-process vLLM engines and Ray clusters). Extra arguments
# go to both pytest runs. Exit status: 0 when both pass.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
unit_log=$(mktemp)
trap 'rm -f "$unit_log"' EXIT
"$py" -m pytest -q tests/unit "$@" >"$unit_log" 2>&1 &
unit_pid=$!
"$py" -m pytest -q tests/integration tests/gpu "$@"
integration_rc=$?
wait "$unit_pid"
unit_rc=$?
echo "---- unit tests (tests/unit, run beside the integration tests) ----"
cat "$unit_log"
echo "tests: integration rc=$integration_rc, unit rc=$unit_rc"
[ "$integration_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
