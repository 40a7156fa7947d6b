#!/usr/bin/env bash
# The test suite, as the README runs it: the linter, then two pytest processes side by side:
# the Triton kernels through the CPU interpreter (TRITON_INTERPRET is read when kernels are
# decorated, so it is per process), and everything else (reference, API, tracing with
# torch.compile / torch.export / opcheck, bench, CLI).  The interpreter process is one
# Python thread at a time, so on a 2-core machine the two together take little more than
# the longer one.  Each process's output is printed whole when both are done; the exit
# status is the first failure's.
#
#   bash scripts/run_tests.sh                  # the full suite
#   bash scripts/run_tests.sh -m "not slow"    # the quick tier
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check mixstack tests scripts
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
TRITON_INTERPRET=1 python -m pytest tests/interpret -q "$@" >"$logs/interpret.log" 2>&1 &
interp=$!
python -m pytest tests --ignore=tests/interpret -q "$@" >"$logs/tracing.log" 2>&1 &
tracing=$!
rc_interp=0; wait "$interp" || rc_interp=$?
rc_tracing=0; wait "$tracing" || rc_tracing=$?
echo "== the interpreter process (TRITON_INTERPRET=1 pytest tests/interpret): exit $rc_interp"
cat "$logs/interpret.log"
echo "== the tracing process (pytest tests --ignore=tests/interpret): exit $rc_tracing"
cat "$logs/tracing.log"
if [ "$rc_interp" -ne 0 ]; then exit "$rc_interp"; fi
exit "$rc_tracing"
