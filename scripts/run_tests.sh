#!/usr/bin/env bash
# The test suite, as the README runs it: the linter, then the Triton kernels through
# the CPU interpreter in one pytest process (TRITON_INTERPRET is read when kernels are
# decorated, so it is per process), then everything else (reference, API, tracing with
# torch.compile / torch.export / opcheck, bench, CLI) in a second.
#
#   bash scripts/run_tests.sh                  # the full suite
#   bash scripts/run_tests.sh -m "not slow"    # the quick tier
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check mixstack tests scripts
TRITON_INTERPRET=1 python -m pytest tests/interpret -q "$@"
python -m pytest tests --ignore=tests/interpret -q "$@"
