#!/usr/bin/env bash
# The test suite, as the README runs it: the linter, then three pytest processes side by side:
# the Triton kernels through the CPU interpreter (TRITON_INTERPRET is read when kernels are
# decorated, so it is per process); the files whose tests trace and compile whole models
# (deepmd-kit's compiled inference and freezes, frozen packages: torch's tracing and Inductor,
# minutes of one core each); and everything else (reference, API, tracing with torch.compile /
# torch.export / opcheck, bench, CLI).  Each process is mostly one Python thread, and the three
# take about the same time alone, so on a 2-core machine they keep both cores busy to the end.
# All stream as they run, each line prefixed with its process ([interp]: one line per test, its
# tests being slow; [compiles] and [tracing]: one line per file); when all are done each one's
# failures and final count are printed again.  The exit status is the first failure's (interp,
# compiles, tracing, in that order).
#
#   bash scripts/run_tests.sh                  # the full suite
#   bash scripts/run_tests.sh -m "not slow"    # the quick tier
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check mixstack tests scripts
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export PYTHONUNBUFFERED=1          # each line reaches the stream when pytest writes it

# run NAME COMMAND...: COMMAND's output to $logs/NAME.log and, prefixed "[NAME] ", to stdout;
# its exit status to $logs/NAME.rc.
run() {
    local name=$1 line
    shift
    { local rc=0; "$@" 2>&1 || rc=$?; echo "$rc" >"$logs/$name.rc"; } | tee "$logs/$name.log" |
        while IFS= read -r line; do printf '[%s] %s\n' "$name" "$line"; done
}

# the whole-model compiles: each file's tests take 100-300 s of one core on CI's machine
compiles=(tests/test_deepmd_frame.py tests/test_deepmd_plugin.py tests/test_potential_deploy.py
          tests/test_deepmd_freeze.py)
opts=(-o console_output_style=count --durations=40)  # --durations: the slowest tests, for the suite's time budget
run interp env TRITON_INTERPRET=1 python -m pytest tests/interpret -v "${opts[@]}" "$@" &
run compiles python -m pytest "${compiles[@]}" "${opts[@]}" "$@" &
run tracing python -m pytest tests --ignore=tests/interpret "${compiles[@]/#/--ignore=}" "${opts[@]}" "$@" &
wait

status=0
for name in interp compiles tracing; do
    rc=$(cat "$logs/$name.rc")
    echo "== [$name] exit $rc"
    grep -E '^(FAILED|ERROR) ' "$logs/$name.log" || true
    tail -n 1 "$logs/$name.log"
    if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi
done
exit "$status"
