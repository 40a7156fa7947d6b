#!/usr/bin/env bash
# The test suite, as the README runs it: the linter, then two pytest processes side by side:
# the Triton kernels through the CPU interpreter (TRITON_INTERPRET is read when kernels are
# decorated, so it is per process), and everything else (reference, API, tracing with
# torch.compile / torch.export / opcheck, bench, CLI).  The interpreter process is one
# Python thread at a time, so on a 2-core machine the two together take little more than
# the longer one.  Both stream as they run, each line prefixed with its process
# ([interp]: one line per test, its tests being slow; [tracing]: one line per file); when
# both are done each one's failures and final count are printed again.  The exit status is
# the first failure's (the interpreter process's, then the tracing process's).
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

opts=(-o console_output_style=count --durations=40)  # --durations: the slowest tests, for the suite's time budget
run interp env TRITON_INTERPRET=1 python -m pytest tests/interpret -v "${opts[@]}" "$@" &
run tracing python -m pytest tests --ignore=tests/interpret "${opts[@]}" "$@" &
wait

status=0
for name in interp tracing; do
    rc=$(cat "$logs/$name.rc")
    echo "== [$name] exit $rc"
    grep -E '^(FAILED|ERROR) ' "$logs/$name.log" || true
    tail -n 1 "$logs/$name.log"
    if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi
done
exit "$status"
