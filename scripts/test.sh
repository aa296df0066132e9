#!/usr/bin/env bash
# The test suite, as CI runs it: the tests `.venv/bin/pytest -q -m "not slow"` runs, in two processes at once. The unit
# tests (~80 s of one core) run beside the integration tests (one torch thread per process, in file order, one at a
# time: two integration files at once interfere through in-process vLLM engines and Ray clusters).
# Tests marked `slow` (over ~30 s each, or a long family such as every method recipe's two steps; see
# pyproject.toml's markers) are left out unless the first argument is --all: the whole suite takes ~22 min on 2
# cores, this one ~14. Extra arguments go to both pytest runs. Exit status: 0 when both pass.
#
#   ./scripts/test.sh            # what CI runs: everything not marked slow
#   ./scripts/test.sh --all      # every test (before a release, or after touching what a slow test guards)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=.venv/bin/python
export PYTHONFAULTHANDLER=1  # a crash in any test process (Ray workers, children) prints every thread's stack
select=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
    select=()
    shift
fi
unit_log=$(mktemp)
trap 'rm -f "$unit_log"' EXIT
"$py" -m pytest -q tests/unit ${select[@]+"${select[@]}"} "$@" >"$unit_log" 2>&1 &
unit_pid=$!
"$py" -m pytest -q tests/integration tests/gpu ${select[@]+"${select[@]}"} "$@"
integration_rc=$?
wait "$unit_pid"
unit_rc=$?
echo "---- unit tests (tests/unit, run beside the integration tests) ----"
cat "$unit_log"
echo "tests: integration rc=$integration_rc, unit rc=$unit_rc"
[ "$integration_rc" -eq 0 ] && [ "$unit_rc" -eq 0 ]
