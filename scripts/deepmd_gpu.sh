#!/usr/bin/env bash
# deepmd-kit's SeZM (DPA4) models on one GPU, in one call of at most ~9 minutes: the GPU tests of
# mixstack.deepmd and of the convolution operators' features it uses, then the deepmd bench at
# ~4000 atoms of water for the water example and the 2-stream lmax-3 config, deepmd-kit at
# DP_TRITON_INFER 0, 2, 3 against the accelerated model at mixstack levels 2 and 3 (frame time,
# peak memory, forces against float64, the value path's stages apart from the rest, NVE through
# deepmd-kit's ASE calculator).  Everything goes under $OUT.
#
#   Usage (repo root, the wheels in .whl/ carried along): OUT=/some/dir bash scripts/deepmd_gpu.sh
#   BUDGET (seconds, default 530) bounds the whole run; each step's timeout is what is left of it
#   (capped per step), so a slow step leaves the later ones their share or is cut, never the run.
#   ATOMS (default 4000), VARIANTS (default dp0,dp2,dp3,ms2,ms3), ROUNDS (default 10),
#   MD_STEPS (default 20), TESTS_SECONDS (default 170: the GPU tests' cap), CONFIGS (default "water two_stream") change the bench.
set -u
OUT=${OUT:?set OUT to a results folder}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${BUDGET:-530}
left() {                    # seconds left of the budget, at most $1
  local rest=$((BUDGET - ($(date +%s) - START)))
  ((rest < 1)) && rest=1
  ((rest > $1)) && rest=$1
  echo "$rest"
}

export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | tail -n 5 | tee "$OUT/install.log"
export PYTHONPATH=$PWD:/tmp/site
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import deepmd, e3nn, ase; from mixstack.deepmd.compat import deepmd_pt; deepmd_pt(); print('deepmd-kit', deepmd.__version__, 'e3nn', e3nn.__version__, 'ase', ase.__version__)"
  python3 -c "import mixstack; print('mixstack from', mixstack.__file__)"
} 2>&1 | tee "$OUT/env.log"

echo "== tests ($(left ${TESTS_SECONDS:-170}) s)"
timeout "$(left ${TESTS_SECONDS:-170})" python3 -m pytest tests/gpu/test_gpu_deepmd.py tests/gpu/test_gpu_conv_streams.py -m gpu -q \
  -p no:cacheprovider -rs --durations=10 2>&1 | tee "$OUT/tests.log" | tail -n 25
echo "tests exit ${PIPESTATUS[0]}" | tee -a "$OUT/tests.log"

configs=(${CONFIGS:-water two_stream})
n=${#configs[@]}
i=0
for config in "${configs[@]}"; do
  # what is left, shared by the configs still to run
  share=$(( $(left 100000) / (n - i) ))
  i=$((i + 1))
  echo "== bench $config ($share s)"
  timeout "$share" python3 -m mixstack bench deepmd --atoms "${ATOMS:-4000}" --configs "$config" \
    --systems water --variants "${VARIANTS:-dp0,dp2,dp3,ms2,ms3}" --rounds "${ROUNDS:-10}" --warmup 2 \
    --breakdown --breakdown-rounds 3 --md-steps "${MD_STEPS:-20}" --md-warmup 3 --out "$OUT/bench-$config" \
    2>&1 | tee "$OUT/bench-$config.log" | grep -v "DP_INFER_BATCH_SIZE" | tail -n 30
  echo "bench $config exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench-$config.log"
done
echo "== done in $(( $(date +%s) - START )) s"
for config in "${configs[@]}"; do
  [ -f "$OUT/bench-$config/deepmd_bench.md" ] && cat "$OUT/bench-$config/deepmd_bench.md"
done
