#!/usr/bin/env bash
# The test suite, as the README runs it: the Triton kernels through the CPU
# interpreter in one pytest process (TRITON_INTERPRET is read when kernels are
# decorated, so it is per process), everything else (reference, API, tracing
# with torch.compile / torch.export / opcheck, bench, CLI) in a second.
set -euo pipefail
cd "$(dirname "$0")/.."
TRITON_INTERPRET=1 python -m pytest tests/interpret -q "$@"
python -m pytest tests --ignore=tests/interpret -q "$@"
