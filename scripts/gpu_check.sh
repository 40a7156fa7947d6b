#!/usr/bin/env bash
# One call on a GPU machine: the GPU-marked tests (bitwise run-to-run, level 2 ==
# level 1, float64 accuracy, compile/export/opcheck of the Triton branch, int64
# offsets, the potential and its frozen .pt2 on CUDA), then `mixstack bench` over
# S1-S4 and `mixstack bench model`; full logs and results under $OUT, a short
# table last.
#
#   Usage (repo root): OUT=/some/dir bash scripts/gpu_check.sh [bench args]
#   PARTS=tests,tune,stack,model,md,breakdown,baseline,probes (default: tests,stack,model) picks what
#   runs, in that order;
#   "tune" sweeps TUNE_ARGS (default: S1-S4, every family) into $OUT/cache, which
#   the benches then read (copy $OUT/cache/*.json into mixstack/tables/ to ship it);
#   TUNE_SECONDS caps the sweep so that later parts keep time (a key whose sweep is cut
#   off is left uncovered; finished keys are already written).
#   MODEL_ARGS replaces the model bench's default arguments (--levels 0c,2c,3c --atoms 4400
#   --repeats 6 --md-steps 0: the frames the whole-frame targets are set on, ~6 min).
#   "md": MD_ARGS (default --cell cu-bcc --atoms 4400 --levels 2,3,0c,3c --repeats 2 --md-steps 100)
#   adds the MD columns (NVE through the ASE calculator; compiled variants compile with dynamic
#   shapes), ~6 min.  "breakdown": where a frame's time goes, stage by stage, before (the
#   convolution's kernels off, MIXSTACK_CONV_KERNELS=0, levels BREAKDOWN_BEFORE, default 2,3) and
#   after (levels BREAKDOWN_AFTER, default 0c,2,3), both on BREAKDOWN_ARGS (default --cell diamond
#   --atoms 4400 --repeats 3 --md-steps 0), ~4 min.  "baseline": the compiled level-0 frame's
#   forces against float64 (the strict GPU test, BASELINE_TESTS, default its 0c cases), then
#   the candidate standalone reproducers repro/inductor_gpu_*.py, ~3 min.
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
  timeout "$(left)" python3 -m mixstack bench model ${MODEL_ARGS:---levels 0c,2c,3c --atoms 4400 --repeats 6 --md-steps 0} \
    --out "$OUT/model" 2>&1 | tee "$OUT/model.log" | tail -n 20
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench model rc=$r")
}
part_md() {
  mkdir -p "$OUT/md"
  timeout "$(left)" python3 -m mixstack bench model \
    ${MD_ARGS:---cell cu-bcc --atoms 4400 --levels 2,3,0c,3c --repeats 2 --md-steps 100} --no-plot --out "$OUT/md" \
    2>&1 | tee "$OUT/md.log" | tail -n 25
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench model (MD) rc=$r")
}
part_breakdown() {
  local args=(${BREAKDOWN_ARGS:---cell diamond --atoms 4400 --repeats 3 --md-steps 0}) half=$(( $(left) / 2 ))
  mkdir -p "$OUT/breakdown-before" "$OUT/breakdown-after"
  MIXSTACK_CONV_KERNELS=0 timeout "$half" python3 -m mixstack bench model "${args[@]}" \
    --levels "${BREAKDOWN_BEFORE:-2,3}" --breakdown --no-plot --out "$OUT/breakdown-before" 2>&1 \
    | tee "$OUT/breakdown-before.log" | tail -n 5
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("breakdown before (conv kernels off) rc=$r")
  timeout "$(left)" python3 -m mixstack bench model "${args[@]}" --levels "${BREAKDOWN_AFTER:-0c,2,3}" \
    --breakdown --no-plot --out "$OUT/breakdown-after" 2>&1 | tee "$OUT/breakdown-after.log" | tail -n 5
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("breakdown after rc=$r")
  sed -n '/## Where the time goes/,$p' "$OUT/breakdown-after/bench_model.md" | head -n 30
}
part_baseline() {
  timeout "$(left)" python3 -m pytest tests/gpu/test_gpu_potential.py -m gpu -q -p no:cacheprovider -rs \
    -k "${BASELINE_TESTS:-compiled_bench_frame_forces and 0c}" 2>&1 | tee "$OUT/baseline_tests.log" | tail -n 8
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("compiled baseline test rc=$r: $(tail -n 1 "$OUT/baseline_tests.log")")
  local script
  for script in repro/inductor_gpu_*.py; do
    [ -e "$script" ] || continue
    echo "== $script" | tee -a "$OUT/repro.log"
    timeout 120 python3 "$script" 2>&1 | tail -n 8 | tee -a "$OUT/repro.log"
    summary+=("$script rc=${PIPESTATUS[0]}: $(tail -n 1 "$OUT/repro.log")")
  done
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
    tests|tune|model|md|breakdown|baseline|probes) "part_$part" ;;
    stack) part_stack "$@" ;;
    *) echo "unknown part '$part' (use tests, tune, stack, model, md, breakdown, baseline, probes)"; rc=2 ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf /tmp/gpu_check.tgz --exclude='*.lock' . && find . -mindepth 1 -not -name summary.txt -delete \
  && mv /tmp/gpu_check.tgz .)
exit $rc
