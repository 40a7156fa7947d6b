#!/usr/bin/env bash
# One call on a GPU machine: the GPU-marked tests (bitwise run-to-run, level 2 ==
# level 1, float64 accuracy, compile/export/opcheck of the Triton branch, int64
# offsets, the potential and its frozen .pt2 on CUDA), then `mixstack bench` over
# S1-S4 and `mixstack bench model`; full logs and results under $OUT, a short
# table last.
#
#   Usage (repo root): OUT=/some/dir bash scripts/gpu_check.sh [bench args]
#   PARTS=tests,tune,stack,model,train,probes (default: tests,stack,model) picks what runs, in that order;
#   "tune" sweeps TUNE_ARGS (default: S1-S4, every family) into $OUT/cache, which
#   the benches then read (copy $OUT/cache/*.json into mixstack/tables/ to ship it);
#   TUNE_SECONDS caps the sweep so that later parts keep time (a key whose sweep is cut
#   off is left uncovered; finished keys are already written).
#   MODEL_ARGS replaces the model bench's default arguments (--levels 0c,0,1c,2c,3c).
#   "train" runs `mixstack bench train` (a force-matching training step: the stack at S1-S4,
#   the potential at ~500 and ~2000 atoms, L0 eager and compiled, L1-L3); TRAIN_ARGS replaces
#   its arguments.  Level 3 of the weight reductions needs stack_wgrad_compensated entries:
#   run "tune" first with TUNE_ARGS="--shape S1 --shape S2 --shape S4 --family stack_wgrad_compensated".
#   Wheels under .whl/ (ase, vesin for a machine without them) are installed
#   into /tmp/site first.  "probes": PROBES, ';'-separated scripts/ commands
#   (default: the compiled baseline's force-error bisect, then the memory at the
#   peak of a model frame; "probe_freeze.py --matrix" is the AOTI-crash matrix).
#   FREEZE=0 skips the freeze tests' process (on the lent H200 it runs ~3 min before the
#   known AOTInductor loader crash of that image).
#   BUDGET (seconds, default 540) bounds the whole script: each part gets what
#   is left, so the packing at the end always runs.  Everything under $OUT is
#   packed into $OUT/gpu_check.tgz (a device call returns at most 8 files);
#   summary.txt stays beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-check}
PARTS=${PARTS:-tests,stack,model}
export MIXSTACK_CACHE_DIR=${MIXSTACK_CACHE_DIR:-$OUT/cache}
mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${BUDGET:-540} ))
left() { local s=$(( DEADLINE - $(date +%s) )); echo $(( s > 5 ? s : 5 )); }
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } 2>&1 | tee "$OUT/env.txt"

rc=0
summary=()
part_tests() {
  # the freeze tests in their own process: a crash inside AOTInductor's loader must not
  # take the other GPU tests with it
  timeout "$(left)" python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rs \
    --deselect tests/gpu/test_gpu_freeze.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 15
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("gpu tests rc=$r: $(tail -n 1 "$OUT/gpu_tests.log")")
  if [ "${FREEZE:-1}" = 0 ]; then summary+=("gpu freeze tests skipped (FREEZE=0)"); return; fi
  timeout "$(left)" python3 -m pytest tests/gpu/test_gpu_freeze.py -m gpu -q -p no:cacheprovider -rs \
    2>&1 | tee "$OUT/gpu_freeze_tests.log" | tail -n 5
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("gpu freeze tests rc=$r: $(tail -n 1 "$OUT/gpu_freeze_tests.log")")
}
part_tune() {
  local limit=$(left)
  if [ -n "${TUNE_SECONDS:-}" ] && [ "$TUNE_SECONDS" -lt "$limit" ]; then limit=$TUNE_SECONDS; fi
  timeout "$limit" python3 -m mixstack tune ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("tune rc=$r")
}
part_stack() {
  mkdir -p "$OUT/bench"
  local args=("$@")
  if [ "${#args[@]}" -eq 0 ]; then args=(--shape S1 --shape S2 --shape S3 --shape S4 --levels 0,0c,1,2,3); fi
  timeout "$(left)" python3 -m mixstack bench "${args[@]}" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -n 40
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench stack rc=$r")
}
part_model() {
  mkdir -p "$OUT/model"
  timeout "$(left)" python3 -m mixstack bench model ${MODEL_ARGS:---levels 0c,0,1c,2c,3c} --out "$OUT/model" 2>&1 | tee "$OUT/model.log" | tail -n 20
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench model rc=$r")
}
part_train() {
  mkdir -p "$OUT/train"
  timeout "$(left)" python3 -m mixstack bench train ${TRAIN_ARGS:-} --out "$OUT/train" 2>&1 | tee "$OUT/train.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench train rc=$r")
}
part_probes() {
  local probes probe name
  IFS=';' read -r -a probes <<< "${PROBES:-probe_inductor.py cu-bcc 500;probe_memory.py cu-bcc 4400}"
  for probe in "${probes[@]}"; do
    name=${probe%%.py*}
    echo "== $probe" | tee -a "$OUT/probes.log"
    timeout "$(left)" python3 scripts/$probe 2>&1 | grep -v "Warning\|warnings.warn\|^$" | tee "$OUT/$name.log" \
      | tail -n 25 | tee -a "$OUT/probes.log"
    r=${PIPESTATUS[0]}; summary+=("$name rc=$r")
  done
}
IFS=',' read -r -a parts <<< "$PARTS"
for part in "${parts[@]}"; do              # in the order PARTS names them
  case "$part" in
    tests|tune|model|train|probes) "part_$part" ;;
    stack) part_stack "$@" ;;
    *) echo "unknown part '$part' (use tests, tune, stack, model, train, probes)"; rc=2 ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf /tmp/gpu_check.tgz --exclude='*.lock' . && find . -mindepth 1 -not -name summary.txt -delete \
  && mv /tmp/gpu_check.tgz .)
exit $rc
