#!/usr/bin/env bash
# deepmd-kit's SeZM (DPA4) models on one GPU, in one call of at most ~9 minutes: the GPU tests of
# mixstack.deepmd and of the convolution operators' features it uses, then the deepmd bench at
# ~4000 atoms of water for the water example and the 2-stream lmax-3 config: deepmd-kit's level 2
# eager and its compiled inference (DP_COMPILE_INFER=1) at levels 2 and 3 (its level 3 runs its
# fp16x3 stack where its tables validate the key) against the accelerated model at level 3 through
# FrameRunner's CUDA graph, eager and compiled (frame time, busy time and
# host gap, peak memory, forces against float64, stages, NVE).  Everything goes under $OUT.  A
# compiled variant traces and compiles for 1.5-3 minutes at its first frame, on one core: with
# PROCESSES=1 (the default with ONE_RUN) each variant builds in a process of its own, all at once
# (`--processes`), so a case takes about its slowest variant's build, not the sum.
#
#   Usage (repo root, the wheels of scripts/deepmd_wheels.sh in .whl/ carried along):
#   OUT=/some/dir bash scripts/deepmd_gpu.sh
#   BUDGET (seconds, default 530) bounds the whole run; each step's timeout is what is left of it
#   (capped per step), so a slow step leaves the later ones their share or is cut, never the run.
#   ATOMS (default 4000), VARIANTS (default dp2,ms3g,dp2c,dp3c,ms3cg), ROUNDS (default 10),
#   VARIANTS_<config> (e.g. VARIANTS_two_stream) replaces VARIANTS for one config, SECONDS_<config> its
#   share of the budget (default: what is left, split evenly among the configs still to run),
#   MD_STEPS (default 100: a few neighbour-list rebuilds at 300 K; 0 without ase), TESTS_SECONDS
#   (default 170: the GPU tests' cap), CONFIGS (default "water two_stream") change the bench;
#   SECONDS_MARGIN (default 15) is how long before its share each bench stops starting steps
#   (--seconds), the share itself the hard stop (timeout).  COMPILE_CACHE=DIR keeps Inductor's and
#   Triton's caches there (a git-ignored folder of the checkout, e.g. results/tmp-compile-cache, stays
#   between calls on a warm machine): a later call's compiled variants then mostly hit them.
#   ONE_RUN=1 runs every config in one bench (--variants-for from VARIANTS_<config>) into
#   $OUT/bench-all: the ratios of both configs from one run.  PROCESSES=1|0 (default 1 with ONE_RUN,
#   else 0): --processes or not.  A case's variants hold device memory together: on an 80 GB card
#   three 2-stream variants fit (~14-17 GiB each, ~22 while building); five ran out of memory.
#   BUILD_AHEAD=1|0 (default 1 with ONE_RUN on a card of at least 120 GiB): --build-ahead, both
#   configs' variants built at once before either is timed (on an H200 the builds one config after
#   the other, ~150 s for water's and over 230 s for the 2-stream config's, did not fit one call).
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
if [ -z "${INSTALLED:-}" ]; then          # gpu_check.sh installed the wheels already
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tail -n 5 | tee "$OUT/install.log"
fi
export PYTHONPATH=$PWD:/tmp/site
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 - <<'PY'
import importlib
found, missing = {}, []
for name in ("deepmd", "e3nn", "ase"):                  # ase: only MD (--md-steps) needs it
    try:
        found[name] = importlib.import_module(name).__version__
    except Exception as err:                             # one missing package must not hide the others
        missing.append(f"{name} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
if "deepmd" in found:
    from mixstack.deepmd.compat import deepmd_pt
    deepmd_pt()
print(", ".join(f"{name} {version}" for name, version in found.items()) or "none of deepmd, e3nn, ase")
if missing:
    print("missing:", "; ".join(missing))
PY
  python3 -c "import mixstack; print('mixstack from', mixstack.__file__)"
} 2>&1 | tee "$OUT/env.log"

if [ "${TESTS_SECONDS:-170}" -gt 0 ]; then
  echo "== tests ($(left ${TESTS_SECONDS:-170}) s)"
  timeout "$(left ${TESTS_SECONDS:-170})" python3 -m pytest tests/gpu/test_gpu_deepmd.py \
    tests/gpu/test_gpu_conv_streams.py -m gpu -q -p no:cacheprovider -rs --tb=short --durations=10 -k "not slow" \
    2>&1 | tee "$OUT/tests.log" | tail -n 25
  echo "tests exit ${PIPESTATUS[0]}" | tee -a "$OUT/tests.log"
fi

md_steps=${MD_STEPS:-100}
if ((md_steps > 0)) && ! python3 -c "import ase" 2>/dev/null; then
  echo "ase is missing (its wheel in .whl/?): the bench runs without MD"
  md_steps=0
fi
# deepmd-kit's SeZM kernels autotune at their first call (DP_TRITON_INFER >= 1): each says how long
# in the bench's log, and the sum is printed after it
export TRITON_PRINT_AUTOTUNING=${TRITON_PRINT_AUTOTUNING:-1}

if [ -n "${COMPILE_CACHE:-}" ]; then
  mkdir -p "$COMPILE_CACHE/inductor" "$COMPILE_CACHE/triton"
  export TORCHINDUCTOR_CACHE_DIR=$(realpath "$COMPILE_CACHE/inductor") TRITON_CACHE_DIR=$(realpath "$COMPILE_CACHE/triton")
  echo "compile caches under $COMPILE_CACHE: $(du -sh "$COMPILE_CACHE" | cut -f1) already there"
fi
configs=(${CONFIGS:-water two_stream})
processes=()
[ "${PROCESSES:-${ONE_RUN:+1}}" = 1 ] && processes=(--processes)
if [ -z "${BUILD_AHEAD:-}" ] && [ -n "${ONE_RUN:-}" ]; then      # a card that holds both configs' builds
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  [ "${mib:-0}" -ge 122880 ] 2>/dev/null && BUILD_AHEAD=1
fi
[ "${BUILD_AHEAD:-0}" = 1 ] && [ ${#processes[@]} -gt 0 ] && processes+=(--build-ahead)
bench() {   # NAME SHARE ARGS...: one `mixstack bench deepmd` into $OUT/bench-NAME within SHARE seconds
  local name=$1 share=$2; shift 2
  # the bench stops starting steps SECONDS_MARGIN s before its share and writes what it has;
  # timeout is the hard stop (the record on disk then names the step it was in)
  local seconds=$((share - ${SECONDS_MARGIN:-15}))
  ((seconds < 1)) && seconds=1
  echo "== bench $name ($share s, --seconds $seconds)"
  timeout "$share" python3 -m mixstack bench deepmd --atoms "${ATOMS:-4000}" --systems water "$@" \
    --rounds "${ROUNDS:-10}" --warmup 2 --breakdown --breakdown-rounds 3 --md-steps "$md_steps" --md-warmup 3 \
    "${processes[@]}" --seconds "$seconds" --out "$OUT/bench-$name" 2>&1 | tee "$OUT/bench-$name.log" \
    | grep -v -e "DP_INFER_BATCH_SIZE" -e "^Triton autotuning for function" -e "^with key as" \
      -e "^finished after" -e "^best config selected" | tail -n 80
  echo "bench $name exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench-$name.log"
  grep -h "^finished after" "$OUT/bench-$name.log" \
    | awk '{n++; s += $3} END {if (n) printf "Triton autotuning: %d kernels, %.1f s\n", n, s}'
}
if [ -n "${ONE_RUN:-}" ]; then          # every config in one bench process: the ratios of one run
  per=()
  for config in "${configs[@]}"; do
    v="VARIANTS_$config"; [ -n "${!v:-}" ] && per+=(--variants-for "$config=${!v}")
  done
  bench all "$(left 100000)" --configs "$(IFS=,; echo "${configs[*]}")" \
    --variants "${VARIANTS:-dp2,ms3g,dp2c,dp3c,ms3cg}" "${per[@]}"
  configs=()                            # nothing more to run one by one
fi
n=${#configs[@]}
i=0
for config in "${configs[@]}"; do
  # what is left, shared by the configs still to run
  share=$(( $(left 100000) / (n - i) ))
  fixed="SECONDS_$config"; share=${!fixed:-$share}
  variants="VARIANTS_$config"; variants=${!variants:-${VARIANTS:-dp2,ms3g,dp2c,dp3c,ms3cg}}
  i=$((i + 1))
  bench "$config" "$share" --configs "$config" --variants "$variants"
done
echo "== done in $(( $(date +%s) - START )) s"
for config in "${configs[@]}" all; do    # also a run cut off: its record as far as it got
  [ -f "$OUT/bench-$config/deepmd_bench.md" ] && cat "$OUT/bench-$config/deepmd_bench.md"
done
