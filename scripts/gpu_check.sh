#!/usr/bin/env bash
# One call on a GPU machine: the GPU-marked tests (bitwise run-to-run, level 2 ==
# level 1, float64 accuracy, compile/export/opcheck of the Triton branch, int64
# offsets), then `mixstack bench` over S1-S4; full logs and results under $OUT,
# a short table last.   Usage (repo root): OUT=/some/dir bash scripts/gpu_check.sh [bench args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
mkdir -p "$OUT/bench"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } 2>&1 | tee "$OUT/env.txt"

python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 15
tests_rc=${PIPESTATUS[0]}

if [ "$#" -eq 0 ]; then set -- --shape S1 --shape S2 --shape S3 --shape S4 --levels 0,0c,1,2; fi
python3 -m mixstack.cli bench "$@" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -n 60
bench_rc=${PIPESTATUS[0]}
echo "gpu tests rc=$tests_rc  bench rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
