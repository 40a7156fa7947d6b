#!/usr/bin/env bash
# One call on a GPU machine: the GPU-marked tests (bitwise run-to-run, level 2 ==
# level 1, float64 accuracy, compile/export/opcheck of the Triton branch, int64
# offsets, the potential and its frozen .pt2 on CUDA), then `mixstack bench` over
# S1-S4 and `mixstack bench model`; full logs and results under $OUT, a short
# table last.
#
#   Usage (repo root): OUT=/some/dir bash scripts/gpu_check.sh [bench args]
#   PARTS=tests,tune,retune,grid,stack,model,md,breakdown,baseline,probe,stackprobe,deepmdprobe,train,lammps,scaling,tma,tmaprobe,gluonprobe,chainprobe,aoti,pt2,deepmd,deepmdlammps (default:
#   tests,stack,model) picks what runs, in that order;
#   "tune" sweeps TUNE_ARGS (default: S1-S4, every family) into $OUT/cache, which
#   the benches then read (copy $OUT/cache/*.json into mixstack/tables/ to ship it);
#   TUNE_SECONDS caps the sweep so that later parts keep time (a key whose sweep is cut
#   off is left uncovered; finished keys are already written).
#   "retune": the quick sweep (mixstack tune) of every key of the last measured H200 table
#   (RETUNE_TABLE, default results/2026-12-01-h200-tuning/NVIDIA_H200.json: the 18 keys a kernel
#   change voided) into $OUT/cache/NVIDIA_H200.json (copy it over mixstack/tables/NVIDIA_H200.json
#   to ship it);
#   RETUNE_FROM=DIR (a folder in the repo holding a previous slice's cache/*.json) resumes:
#   its keys are covered and skipped.  RETUNE_ARGS adds tune options (e.g. --full).
#   "grid": `mixstack bench grid` into $OUT/grid, bounded by the time left (GRID_SECONDS caps
#   it); GRID_ARGS picks the subset (e.g. "--focus-dim 80,96,112,128 --lmax 1"; several slices, each
#   with its own levels, separated by " | ", run into the same folder in turn); GRID_FROM=DIR
#   (a folder in the repo holding a previous slice's grid/keys/*.json) resumes: those keys are
#   copied in and skipped; GRID_REDO="Cf80-l1 Cf112-l3 ..." measures those (Cf, lmax) groups again.
#   GRID_PROFILE=1 runs the measuring process under cProfile ($OUT/grid.prof: where a key's
#   seconds go outside its timed calls).  GRID_WARM_WORKERS (default auto: half the cores, at most 8) compile each batch
#   of (Cf, lmax) groups in worker processes before it is measured (0: off).
#   TUNE_WARM_WORKERS (default auto) does the same for "tune" and "retune": each key's kernels are
#   compiled in workers before its sweep times anything; their logs end with the seconds per key.
#   MODEL_ARGS replaces the model bench's default arguments (--levels 0c,2c,3c --atoms 4400
#   --repeats 6 --md-steps 0: the frames the whole-frame targets are set on, ~6 min).
#   "gridcheck": the regression guard on the GPU: `mixstack bench grid GRIDCHECK_ARGS --check
#   GRIDCHECK_BASE` (default the newest results/*-h200-grid) into $OUT/gridcheck, bounded by the
#   time left; the summary names the keys slower than their noise.
#   "md": MD_ARGS (default --cell cu-bcc --atoms 4400 --levels 2g,3g,2,3,0c --repeats 2 --md-steps 100)
#   adds the MD columns (NVE through the ASE calculator; compiled variants compile with dynamic
#   shapes), ~6 min; several runs separated by " | " write $OUT/md, $OUT/md-2, ...
#   "breakdown": where a frame's time goes, stage by stage, before (the
#   convolution's kernels off, MIXSTACK_CONV_KERNELS=0, levels BREAKDOWN_BEFORE, default 2,3) and
#   after (levels BREAKDOWN_AFTER, default 0c,2,3), both on BREAKDOWN_ARGS (default --cell diamond
#   --atoms 4400 --repeats 3 --md-steps 0), ~4 min.  "baseline": the compiled level-0 frame's
#   forces against float64 (the strict GPU test, BASELINE_TESTS, default its 0c cases), then
#   the candidate standalone reproducers repro/inductor_gpu_*.py, ~3 min.
#   "probe": scripts/frame_probe.py (PROBE_ARGS): one frame's kernels by device time and the
#   allocations alive at its peak memory, per level, under $OUT/probe.
#   "stackprobe": scripts/stack_probe.py (STACK_PROBE_ARGS, default Cf112-l4-F1, Cf128-l5-F1 and Cf80-l4-F1 at
#   variants 0c,1,1b,1bn): one forward + backward of the stack kernel by kernel, under $OUT/stackprobe.
#   "deepmdprobe": scripts/deepmd_probe.py (DEEPMD_PROBE_ARGS, default --variants ms3cg; the wheels of .whl/):
#   a deepmd-kit frame's kernels, a graphed variant's memory by pool and its eager peak, under $OUT/deepmdprobe.
#   "pt2conv": repro/pt2_conv_kernels.py (PT2CONV_ARGS, default --load; the wheels of .whl/ and the LAMMPS
#   carry's MPICH): deepmd-kit's freeze steps on a one-block accelerated model with the convolution's
#   operators recorded, the kernels AOTInductor refuses, the package's kernels and outputs, ~2 min.
#   "restprobe": scripts/rest_products_probe.py (RESTPROBE_ARGS): deepmd-kit's products at the water and 2-stream
#   configs' shapes, exact fp32 against the compensated ATen form (eager, compiled) and the kernel form at six
#   launch configs, each timed as its CUDA-graph replay, under $OUT/restprobe, ~2-3 min.
#   "convprobe": scripts/conv_probe.py (CONVPROBE_ARGS): rotate-in forward and backward at the
#   frame's shape per edge-kernel launch config, then `ncu` on one NCU_KERNEL launch (default
#   rotate_in_grad_kernel), under $OUT/convprobe.
#   "train" runs `mixstack bench train` (a force-matching training step: the stack at S1-S4,
#   the potential at ~500 and ~2000 atoms, L0 eager and compiled, L1-L3); TRAIN_ARGS replaces
#   its arguments.  Level 3 of the weight reductions needs stack_wgrad_compensated entries:
#   run "tune" first with TUNE_ARGS="--shape S1 --shape S2 --shape S4 --family stack_wgrad_compensated".
#   Wheels under .whl/ (ase, vesin for a machine without them) are installed
#   into /tmp/site first.
#   FREEZE=0 skips the freeze tests' process (on the lent H200 it runs ~3 min before the
#   known AOTInductor loader crash of that image).
#   "lammps": the potential as a LAMMPS pair style (pip LAMMPS + MPICH, unpacked from
#   .lammps-carry/lammps-runtime.tar.xz, which scripts/lammps_carry.sh builds): for each
#   LAMMPS_CASES entry ATOMS:MODEL:STEPS (default "4400:bench:20 50000:small:10"; diamond cells)
#   the ASE path and one LAMMPS rank, then LAMMPS_RANKS ranks (default "2 4") sharing the GPU at
#   the last case; records and a table (steps/s against ASE, per-call phases, host-device copies,
#   peak memory) under $OUT/lammps.  LAMMPS_DEVICE (default cuda; cpu to try it without a GPU).
#   "scaling": LAMMPS MD over several ranks, one per GPU (`mixstack scaling`; the
#   LAMMPS runtime as for "lammps"): steps/s, parallel efficiency, a step's time split, peak memory
#   per GPU, and step-0 energies and forces of every rank count against the fewest, at SCALING_LEVELS
#   (default "2 3").  With 2 or more GPUs it measures SCALING_RANKS (default 1 2 4 ... up to the GPU
#   count) on SCALING_STRONG (default diamond:50000 cu-bcc:50000 diamond:500000:scaling-lite
#   cu-bcc:500000:scaling-lite; STRUCTURE:ATOMS[:MODEL], model default scaling) and
#   SCALING_WEAK (atoms per rank, default diamond:100000 cu-bcc:100000); with one GPU (or
#   LAMMPS_DEVICE=cpu) it is a DRY RUN of the same procedure, ranks 1 2 4 sharing the GPU, on
#   SCALING_STRONG=diamond:20000 cu-bcc:20000:scaling-lite and SCALING_WEAK=diamond:5000.  SCALING_STEPS (10; dry
#   run 5), SCALING_WARMUP (3; dry run 2).  NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
#   TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).  Results under $OUT/scaling.
#   "tma": level 3's TMA-fed GEMMs (kernels.gemm_tma): `mixstack bench` at level 3 (TMA_BENCH, default S1-S4 --levels 0c,3 --pass both) on the
#   pointer kernel, the quick sweep of stack_compensated_tma at TMA_TUNE (default S1-S4; level 3's
#   own config is swept first where a key has none), the same bench again on the new entries, then
#   the GPU tests that hold the TMA forms to the pointer kernel (~270 s on an H100), and `ncu` on one
#   TMA launch at S1 (NCU_TMA=0 skips it); under $OUT/tma, ~10 min.
#   "tmaprobe": scripts/tma_stack_probe.py: every stack_compensated_tma candidate at S1's key (E 4099) through
#   the stack at level 3 against the pointer kernel at its tile (non-finite values, differences, the first
#   wrong edge rows and their E tiles), then the quick forms at the other two GPU-test keys; under $OUT/tma.
#   "gluonprobe": scripts/gluon_gemm_probe.py, level 3's compensated block product with explicit warp
#   partitions (Gluon) against its Triton twin: the machine's Triton compiles every config for sm_90
#   (registers, spills), `compute-sanitizer --tool racecheck` runs one small launch of each config,
#   then bits against the twin and float64 and interleaved rates at GLUON_ROWS (default 600006);
#   under $OUT/gluonprobe, ~4 min (40 Gluon compiles, twice with racecheck).
#   "chainprobe": scripts/gluon_chain_probe.py, design B's product phase (a row tile kept in shared memory
#   across CHAIN_LAYERS compensated products, default 4; and two tiles an SM in ping-pong partitions)
#   against the one-product twin run layer by layer, the
#   same steps as "gluonprobe", under $OUT/chainprobe; CHAIN_FORMS (e.g. "pingpong,pingpong-inflight") picks the
#   kernel's forms (default all: chain, pingpong and both with MMAs in flight across K steps).  Both probes' racecheck and GPU steps stop after
#   GLUON_STEP_SECONDS (default 240) each, so that a kernel that hangs leaves the call's other parts time.
#   "chainprobe" then runs repro/gluon_ws_racecheck.py under racecheck, plain and with --sync.
#   "fwdprobe": scripts/gluon_forward_probe.py, design B's forward (level 3's stack forward in one persistent
#   kernel, the row tile on chip across the layers, gate and epilogues included): the "gluonprobe" steps,
#   bits against its twin, times beside level 3's forward as it ships at FWD_EDGES (default 300003), ~2 min.
#   "fwdncu": ncu (the same sections as "chainncu") on the forward probe's first FWD_NCU_COUNT launches (default 2).
#   "chainncu": ncu (speed of light, compute and memory workload, warp stalls) on the chain's first
#   CHAIN_NCU_COUNT launches (default 4) of CHAIN_FORMS (default chain-inflight,chain-prefetch-swizzle).
#   "aoti": repro/aoti_loader_crash.py (AOTInductor's loader, every loading path in its own process; the
#   compiler's libstdc++ preloaded; the package from each other compiler; the package with its own hidden
#   libstdc++, mixstack.cxx_runtime's way) and a cuda-gdb backtrace of aoti_load_package (AOTI_GDB=0
#   skips it), under $OUT/aoti.  MIXSTACK_PRIVATE_CXX_RUNTIME=1 PARTS=pt2 freezes with that runtime.
#   "pt2": scripts/pt2_check.py: mixstack's potential frozen at PT2_LEVELS (default 1,2,3) on the GPU, the
#   mixstack kernels each package holds (read from the archive), then each package loaded in a process of
#   its own (plainly, then with the compiler's libstdc++ preloaded if that crashed) and compared with the
#   live module (forces, time per call), under $OUT/pt2.
#   "deepmd": the GPU tests of mixstack.deepmd (DEEPMD_TESTS, -k DEEPMD_TESTS_K, default "not slow"), then
#   scripts/deepmd_gpu.sh's bench (CONFIGS, VARIANTS, ATOMS, ROUNDS, MD_STEPS), under $OUT/deepmd.
#   "deepmdlammps": deepmd-kit's production route, plain and with mixstack's plugin (scripts/deepmd_lammps.sh,
#   DEEPMD_LAMMPS_ARGS, default --device cuda): `dp --pt-expt freeze` of a water checkpoint to a .pt2 twice
#   (--backend pt in DEEPMD_LAMMPS_ARGS: `dp --pt freeze`), the kernels in each, the .pt2 in DeepPot against
#   the checkpoint, LAMMPS `pair_style deepmd` steps/s on 1 and 2 ranks;
#   the LAMMPS + MPICH runtime from DEEPMD_LAMMPS_CARRY (default .lammps-carry/lammps-runtime-deepmd.tar.xz:
#   LAMMPS 2025.7.22.2.0, the version deepmd-kit 3.2.0's plugin is built against, built by
#   LAMMPS_VERSION=2025.7.22.2.0 PLUGIN=0 CARRY_NAME=lammps-runtime-deepmd bash scripts/lammps_carry.sh; its
#   mpich is also what deepmd-kit's op library, and so the freeze's multi-rank graph, needs); DEEPMD_LAMMPS_WORK (default /tmp/deepmd_lammps; a subfolder per backend) keeps the .pt2 between calls
#   (DEEPMD_LAMMPS_ARGS="--parts ckpt,freeze" then "--parts inspect,deeppot,lammps"), under $OUT/deepmdlammps.
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
upto() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }   # the time left, at most $1 seconds
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
  # GPU_TESTS: the test files or node ids to run (default: every GPU test); GPU_TESTS_K: a -k filter.
  # deepmd-kit's inference switches, set for another part of the call, are not the tests' (a model
  # built under DP_TRITON_INFER cannot be deep-copied, which the tests do)
  # -v: each test named as it ends, so a run the budget cuts off shows where it stood
  env -u DP_TRITON_INFER -u DP_COMPILE_INFER -u DP_TF32_INFER timeout "$(left)" python3 -m pytest ${GPU_TESTS:-tests/gpu} -m gpu -v -p no:cacheprovider -rs --durations=15 \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} --deselect tests/gpu/test_gpu_freeze.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 32
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("gpu tests rc=$r: $(tail -n 1 "$OUT/gpu_tests.log")")
  if [ "${FREEZE:-1}" = 0 ]; then summary+=("gpu freeze tests skipped (FREEZE=0)"); return; fi
  timeout "$(left)" python3 -m pytest tests/gpu/test_gpu_freeze.py -m gpu -q -p no:cacheprovider -rs \
    2>&1 | tee "$OUT/gpu_freeze_tests.log" | tail -n 5
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("gpu freeze tests rc=$r: $(tail -n 1 "$OUT/gpu_freeze_tests.log")")
}
part_tune() {
  local limit=$(left)
  if [ -n "${TUNE_SECONDS:-}" ] && [ "$TUNE_SECONDS" -lt "$limit" ]; then limit=$TUNE_SECONDS; fi
  timeout "$limit" python3 -m mixstack tune --warm-workers "${TUNE_WARM_WORKERS:-auto}" ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("tune rc=$r")
}
part_retune() {
  mkdir -p "$MIXSTACK_CACHE_DIR"
  if [ -n "${RETUNE_FROM:-}" ]; then cp "$RETUNE_FROM"/*.json "$MIXSTACK_CACHE_DIR"/ 2>/dev/null; fi
  local limit=$(( $(left) - 15 )) t0=$(date +%s)
  if [ -n "${RETUNE_SECONDS:-}" ] && [ "$RETUNE_SECONDS" -lt "$limit" ]; then limit=$RETUNE_SECONDS; fi
  timeout "$(left)" python3 -m mixstack tune --keys-of "${RETUNE_TABLE:-results/2026-12-01-h200-tuning/NVIDIA_H200.json}" \
    --seconds "$limit" --warm-workers "${TUNE_WARM_WORKERS:-auto}" ${RETUNE_ARGS:-} 2>&1 | tee "$OUT/retune.log" | tail -n 45
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  summary+=("retune rc=$r: $(grep -c '| tuned' "$OUT/retune.log") tuned, $(grep -c '| covered' "$OUT/retune.log") covered rows in $(( $(date +%s) - t0 )) s")
}
part_grid() {
  mkdir -p "$OUT/grid/keys"
  if [ -n "${GRID_FROM:-}" ]; then cp "$GRID_FROM"/*.json "$OUT/grid/keys"/ 2>/dev/null; fi
  for k in ${GRID_REDO:-}; do rm -f "$OUT/grid/keys/$k"-F*.json; done
  local limit=$(( $(left) - 30 )) t0=$(date +%s)     # room for the outputs and the packing
  if [ -n "${GRID_SECONDS:-}" ] && [ "$GRID_SECONDS" -lt "$limit" ]; then limit=$GRID_SECONDS; fi
  local prof=() sets=() args r label
  if [ -n "${GRID_PROFILE:-}" ]; then prof=(-m cProfile -o "$OUT/grid.prof"); fi
  # GRID_ARGS may hold several slices separated by " | " (e.g. other levels at the wide keys): each
  # measured into the same folder in turn, within what is left of the limit
  IFS='|' read -r -a sets <<< "${GRID_ARGS:- }"
  : > "$OUT/grid.log"
  for args in "${sets[@]}"; do
    limit=$(( t0 + limit - $(date +%s) )); t0=$(date +%s)
    timeout "$(left)" python3 "${prof[@]}" -m mixstack bench grid $args --resume --seconds "$(( limit > 1 ? limit : 1 ))" \
      --warm-workers "${GRID_WARM_WORKERS:-auto}" --out "$OUT/grid" \
      2>&1 | tee -a "$OUT/grid.log" | tail -n 40
    r=${PIPESTATUS[0]}; rc=$(( rc || r ))
    label=""; [ "${#sets[@]}" -gt 1 ] && label="[${args# }] "
    summary+=("bench grid ${label}rc=$r: $(grep -o 'measured [0-9]*, skipped [0-9]* (done before), left [0-9]*' "$OUT/grid.log" | tail -n 1) in $(( $(date +%s) - t0 )) s; warm-up: $(grep -c '\] warm ' "$OUT/grid.log") batches")
  done
}
part_gridcheck() {
  # the regression guard: a grid (GRIDCHECK_ARGS, default the whole grid at the committed grid's
  # edge scale) measured and held to the committed grid (GRIDCHECK_BASE)
  local base=${GRIDCHECK_BASE:-$(ls -d results/*-h200-grid | tail -n 1)}
  mkdir -p "$OUT/gridcheck"
  timeout "$(left)" python3 -m mixstack bench grid ${GRIDCHECK_ARGS:-} --check "$base" --seconds "$(( $(left) - 30 ))" \
    --warm-workers "${GRID_WARM_WORKERS:-auto}" --out "$OUT/gridcheck" 2>&1 | tee "$OUT/gridcheck.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  summary+=("bench grid --check $base rc=$r: $(grep -o 'grid check: .*' "$OUT/gridcheck.log")")
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
  # MD_ARGS may hold several runs separated by " | ": run i writes $OUT/md (i = 1) or $OUT/md-i
  local sets i=1 dir args
  IFS='|' read -r -a sets <<< "${MD_ARGS:---cell cu-bcc --atoms 4400 --levels 2g,3g,2,3,0c --repeats 2 --md-steps 100}"
  for args in "${sets[@]}"; do
    dir="$OUT/md"; [ "$i" -gt 1 ] && dir="$OUT/md-$i"
    mkdir -p "$dir"
    timeout "$(left)" python3 -m mixstack bench model $args --no-plot --out "$dir" \
      2>&1 | tee "$dir.log" | tail -n 25
    r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench model (MD run $i) rc=$r")
    i=$(( i + 1 ))
  done
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
part_probe() {
  timeout "$(left)" python3 scripts/frame_probe.py ${PROBE_ARGS:-} --out "$OUT/probe" 2>&1 | tee "$OUT/probe.log" | tail -n 40
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("frame probe rc=$r")
}
part_stackprobe() {
  # scripts/stack_probe.py (STACK_PROBE_ARGS): one forward + backward of the stack, kernel by kernel,
  # per variant, at the wide keys (default: the compiled reference, level 1, level 1 on cuBLAS in the
  # route's weight layouts and with plain weights)
  timeout "$(left)" python3 scripts/stack_probe.py ${STACK_PROBE_ARGS:---key 112,4,1 --key 128,5,1 --key 80,4,1 --variants 0c,1,1b,1bn} \
    --out "$OUT/stackprobe" 2>&1 | tee "$OUT/stackprobe.log" | tail -n 60
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("stack probe rc=$r")
}
part_deepmdprobe() {
  # scripts/deepmd_probe.py (DEEPMD_PROBE_ARGS, default --variants ms3cg): one deepmd-kit frame's kernels
  # by device time, a graphed variant's memory by pool and its eager peak by where it was allocated
  mkdir -p "$OUT/deepmdprobe"
  timeout "$(left)" python3 scripts/deepmd_probe.py ${DEEPMD_PROBE_ARGS:---variants ms3cg} --out "$OUT/deepmdprobe" 2>&1 \
    | tee "$OUT/deepmdprobe.log" | grep -v -e Autotuning -e DP_INFER | tail -n 60
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("deepmd probe rc=$r")
}
part_pt2conv() {
  # repro/pt2_conv_kernels.py (PT2CONV_ARGS, default --load): deepmd-kit's freeze steps on a one-block
  # accelerated model, the kernels AOTInductor refuses, the package's kernels and outputs
  # (the wheels of .whl/ and the LAMMPS carry's MPICH, which deepmd-kit's op library loads)
  if [ -f "${DEEPMD_LAMMPS_CARRY:-.lammps-carry/lammps-runtime-deepmd.tar.xz}" ]; then
    source scripts/lammps_runtime_env.sh "${DEEPMD_LAMMPS_CARRY:-.lammps-carry/lammps-runtime-deepmd.tar.xz}"
  fi
  timeout "$(left)" python3 repro/pt2_conv_kernels.py ${PT2CONV_ARGS:---load} 2>&1 | tee "$OUT/pt2conv.log" \
    | grep -v -e Warning -e warnings.warn -e "To get the best" | tail -n 20
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("pt2conv rc=$r: $(grep -m1 '^compile:' "$OUT/pt2conv.log")")
}
part_restprobe() {
  # deepmd-kit's products one at a time: exact fp32 against mixstack.deepmd.rest_products (RESTPROBE_ARGS)
  mkdir -p "$OUT/restprobe"
  timeout "$(left)" python3 scripts/rest_products_probe.py ${RESTPROBE_ARGS:-} --out "$OUT/restprobe" 2>&1 \
    | tee "$OUT/restprobe.log" | tail -n 16
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("rest products probe rc=$r")
}
part_convprobe() {
  # rotate-in's forward and backward at the frame's shape per edge-kernel launch config, then
  # Nsight Compute on one backward kernel (CONVPROBE_ARGS, NCU_KERNEL)
  mkdir -p "$OUT/convprobe"
  timeout "$(left)" python3 scripts/conv_probe.py ${CONVPROBE_ARGS:-} --out "$OUT/convprobe" 2>&1 \
    | tee "$OUT/convprobe.log" | tail -n 12
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("conv probe rc=$r")
  if command -v ncu > /dev/null; then
    timeout "$(left)" ncu --clock-control none -k "regex:${NCU_KERNEL:-rotate_in_grad_kernel}" --launch-skip 1 \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
      python3 scripts/conv_probe.py --ncu-run > "$OUT/convprobe/ncu.txt" 2>&1
    summary+=("ncu rc=$?: $(grep -c 'Section:' "$OUT/convprobe/ncu.txt") sections")
  fi
}
part_train() {
  mkdir -p "$OUT/train"
  timeout "$(left)" python3 -m mixstack bench train ${TRAIN_ARGS:-} --out "$OUT/train" 2>&1 | tee "$OUT/train.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("bench train rc=$r")
}
lammps_runtime() {
  # the carried LAMMPS + MPICH (when present) shadow any installed copy; the prebuilt plugin
  # goes into the cache, where mixstack.lammps looks for it before building
  local carry=${LAMMPS_CARRY:-.lammps-carry/lammps-runtime.tar.xz} root=/tmp/lammps-runtime site
  if [ -f "$carry" ]; then
    rm -rf "$root" && mkdir -p "$root" && tar -xJf "$carry" -C "$root" || return 1
    site=$(echo "$root"/prefix/lib/python3*/site-packages)
    export PYTHONPATH=$site:$PYTHONPATH PATH=$root/prefix/bin:$PATH
    mkdir -p "$MIXSTACK_CACHE_DIR" && cp -r "$root/cache/lammps" "$MIXSTACK_CACHE_DIR/"
    head -n 2 "$root/MANIFEST.txt"
  fi
  python3 -c "from mixstack.lammps import import_lammps, plugin_path; import_lammps(); print('plugin', plugin_path())" \
    || return 1
  # mpi4py gathers the ranks' statistics (without it the record holds rank 0's alone)
  python3 -c "from mixstack.lammps import load_mpi; load_mpi(); from mpi4py import MPI; print('mpi4py on', MPI.Get_library_version().splitlines()[0])" \
    || echo "mpi4py not usable: multi-rank records hold rank 0's statistics only"
}
part_lammps() {
  local dir=$OUT/lammps device=${LAMMPS_DEVICE:-cuda} cases=(${LAMMPS_CASES:-4400:bench:20 50000:small:10})
  local ranks=(${LAMMPS_RANKS:-2 4}) case atoms model steps n r
  mkdir -p "$dir"
  lammps_runtime > "$OUT/lammps.log" 2>&1         # not in a pipe: it exports PATH and PYTHONPATH
  r=$?; cat "$OUT/lammps.log"
  if [ "$r" != 0 ]; then
    summary+=("lammps: no LAMMPS runtime (scripts/lammps_carry.sh builds .lammps-carry)"); rc=1; return
  fi
  md_run() {          # NAME then the command; appends to the log and the summary
    local name=$1; shift
    echo "== $name: $*" >> "$OUT/lammps.log"
    timeout "$(left)" "$@" --device "$device" --quiet --json "$dir/$name.json" 2>&1 | tee -a "$OUT/lammps.log" | tail -n 2
    r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("lammps $name rc=$r")
  }
  for case in "${cases[@]}"; do
    IFS=: read -r atoms model steps <<< "$case"
    local args=(-m mixstack md --structure diamond --atoms "$atoms" --model "$model" --steps "$steps" --thermo "$steps")
    md_run "ase-$atoms-$model" python3 "${args[@]}" --engine ase
    md_run "lammps1-$atoms-$model" python3 "${args[@]}"
  done
  for n in "${ranks[@]}"; do
    md_run "lammps$n-$atoms-$model" mpirun -np "$n" python3 "${args[@]}"
  done
  python3 -m mixstack.lammps.report "$dir" && cat "$dir/lammps.md" | tee -a "$OUT/lammps.log" | tail -n 12
}
part_scaling() {
  local dir=$OUT/scaling device=${LAMMPS_DEVICE:-cuda} gpus=0 mode ranks strong weak n budget steps warmup
  mkdir -p "$dir"
  lammps_runtime > "$OUT/scaling.log" 2>&1       # not in a pipe: it exports PATH and PYTHONPATH
  r=$?; cat "$OUT/scaling.log"
  if [ "$r" != 0 ]; then
    summary+=("scaling: no LAMMPS runtime (scripts/lammps_carry.sh builds .lammps-carry)"); rc=1; return
  fi
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  if [ "$device" = cuda ]; then gpus=$(python3 -c "import torch; print(torch.cuda.device_count())"); fi
  if [ "${gpus:-0}" -ge 2 ]; then
    mode=measurement; steps=${SCALING_STEPS:-10}; warmup=${SCALING_WARMUP:-3}; ranks=""; n=1
    while [ "$n" -le "$gpus" ]; do ranks="$ranks $n"; n=$(( n * 2 )); done
    ranks=${SCALING_RANKS:-$ranks}
    strong=${SCALING_STRONG:-diamond:50000 cu-bcc:50000 diamond:500000:scaling-lite cu-bcc:500000:scaling-lite}
    weak=${SCALING_WEAK-diamond:100000 cu-bcc:100000}
  else
    mode="dry run, ranks sharing ${gpus} GPU(s)"; steps=${SCALING_STEPS:-5}; warmup=${SCALING_WARMUP:-2}
    ranks=${SCALING_RANKS:-1 2 4}
    [ "$device" = cpu ] && mode="dry run on the CPU"
    strong=${SCALING_STRONG:-diamond:20000 cu-bcc:20000:scaling-lite}
    weak=${SCALING_WEAK-diamond:5000}
  fi
  budget=$(( $(left) - 20 )); [ "$budget" -lt 10 ] && budget=10
  echo "== scaling ($mode): ranks $ranks; strong $strong; weak $weak; levels ${SCALING_LEVELS:-2 3}" \
    | tee -a "$OUT/scaling.log"
  timeout "$(left)" python3 -m mixstack scaling --device "$device" --ranks "${ranks// /,}" \
    --strong "${strong// /,}" --weak "${weak// /,}" --levels "$(echo ${SCALING_LEVELS:-2 3} | tr ' ' ,)" \
    --steps "$steps" --warmup "$warmup" --budget "$budget" --out "$dir" 2>&1 \
    | tee -a "$OUT/scaling.log" | tail -n 40
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  summary+=("scaling rc=$r ($mode): $(ls "$dir"/points/*-r*.json 2>/dev/null | grep -vc '\.rank') points")
}
part_tma() {
  mkdir -p "$OUT/tma"
  local bench=(${TMA_BENCH:---shape S1 --shape S2 --shape S3 --shape S4 --levels 0c,3 --pass both})
  # the timings first (the tuner rejects a wrong candidate itself); the GPU tests, ~270 s on an H100, last
  timeout "$(left)" python3 -m mixstack bench "${bench[@]}" --out "$OUT/tma/before" 2>&1 | tee "$OUT/tma/bench-before.log" | tail -n 12
  timeout "$(left)" python3 -m mixstack tune ${TMA_TUNE:---shape S1 --shape S2 --shape S3 --shape S4} \
    --family stack_compensated --family stack_compensated_tma 2>&1 | tee "$OUT/tma/tune.log" | tail -n 20
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("tma tune rc=$r")
  timeout "$(left)" python3 -m mixstack bench "${bench[@]}" --out "$OUT/tma/after" 2>&1 | tee "$OUT/tma/bench-after.log" | tail -n 12
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("tma bench rc=$r")
  timeout "$(left)" python3 -m pytest tests/gpu/test_gpu_compensated.py -m gpu -q -p no:cacheprovider -rs -k tma \
    2>&1 | tee "$OUT/tma/gpu_tests.log" | tail -n 5
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("tma gpu tests rc=$r: $(tail -n 1 "$OUT/tma/gpu_tests.log")")
  if [ "${NCU_TMA:-1}" != 0 ] && command -v ncu > /dev/null; then
    timeout "$(left)" ncu --clock-control none -k regex:tma_block_gemm_kernel -c 2 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats python3 -m mixstack bench --shape S1 --levels 3 --pass fwd \
      --repeats 1 --warmup 0 --out "$OUT/tma/ncu-bench" > "$OUT/tma/ncu.txt" 2>&1
    summary+=("tma ncu rc=$?")
  fi
}
part_tmaprobe() {
  # every TMA candidate through the stack against the pointer kernel: S1's key (the GPU test's first
  # case, E 4099), then the quick forms at the other two test keys; under $OUT/tma
  mkdir -p "$OUT/tma"
  timeout "$(left)" python3 scripts/tma_stack_probe.py --out "$OUT/tma/stack_probe_s1.jsonl" 2>&1 \
    | tee "$OUT/tma/stack_probe.log" | cut -c1-400 | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  for k in "--focus 1 --focus-dim 64 --edges 129" "--focus 2 --lmax 6 --edges 1 --layers 3"; do
    timeout "$(left)" python3 scripts/tma_stack_probe.py --quick $k 2>&1 | tee -a "$OUT/tma/stack_probe.log" | cut -c1-400
  done
  summary+=("tma stack probe rc=$r: $(grep -c '"bits_equal": false' "$OUT/tma/stack_probe.log") outputs unequal")
}
racecheck() {   # SECONDS FILE ARGS...: python3 ARGS under compute-sanitizer's racecheck (hazards), its report in FILE
  local seconds=$1 file=$2; shift 2
  timeout "$(upto "$seconds")" compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 20 \
    python3 "$@" > "$file" 2>&1
}
gluon_probe() {   # SCRIPT DIR NAME [probe args]: offline build, racecheck, then bits and rates against the twin
  local script=$1 dir=$OUT/$2 name=$3; shift 3   # the caller's array every_step: arguments of all three steps
  mkdir -p "$dir"
  timeout "$(left)" python3 "scripts/$script" --offline "${every_step[@]}" --out "$dir/offline" 2>&1 \
    | tee "$dir/offline.log" | tail -n 4
  if command -v compute-sanitizer > /dev/null; then
    racecheck "${GLUON_STEP_SECONDS:-240}" "$dir/racecheck.txt" "scripts/$script" --racecheck "${every_step[@]}"
    summary+=("$name racecheck rc=$?: $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$dir/racecheck.txt")")
  fi
  timeout "$(upto "${GLUON_STEP_SECONDS:-240}")" python3 "scripts/$script" "${every_step[@]}" "$@" --out "$dir" 2>&1 \
    | tee "$dir/probe.log" \
    | tail -n 6
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  summary+=("$name rc=$r: $(grep -c '"bits_equal": true' "$dir/probe.log") configs bitwise the twin's")
}
part_gluonprobe() { local every_step=(); gluon_probe gluon_gemm_probe.py gluonprobe "gluon probe" --rows "${GLUON_ROWS:-600006}"; }
part_chainprobe() {
  local every_step=(); [ -n "${CHAIN_FORMS:-}" ] && every_step=(--forms "$CHAIN_FORMS")
  gluon_probe gluon_chain_probe.py chainprobe "chain probe" --rows "${GLUON_ROWS:-600006}" --layers "${CHAIN_LAYERS:-4}"
  if command -v compute-sanitizer > /dev/null; then    # racecheck on partitions alone, then with their own barrier
    for sync in "" --sync; do
      racecheck 60 "$OUT/chainprobe/ws_racecheck$sync.txt" repro/gluon_ws_racecheck.py $sync
      summary+=("ws racecheck [${sync:-plain}] rc=$?: $(grep -E 'outputs|RACECHECK SUMMARY' \
        "$OUT/chainprobe/ws_racecheck$sync.txt" | tr '\n' ' ')")
    done
  fi
}
part_fwdprobe() {
  # design B's forward (scripts/gluon_forward_probe.py): offline build, racecheck, then bits against the
  # twin and times beside level 3's forward as it ships, at FWD_EDGES (default S1's 300003); under $OUT/fwdprobe
  local every_step=()
  gluon_probe gluon_forward_probe.py fwdprobe "forward probe" --edges "${FWD_EDGES:-300003}"
}
probe_ncu() {   # DIR NAME KERNEL COUNT SCRIPT [args]: ncu (clocks unlocked) on the first COUNT launches of KERNEL
  local dir=$OUT/$1 name=$2 kernel=$3 count=$4; shift 4
  mkdir -p "$dir"
  if ! command -v ncu > /dev/null; then summary+=("$name ncu: no ncu"); return; fi
  timeout "$(left)" ncu --clock-control none -k "regex:$kernel" -c "$count" \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    python3 "$@" --rounds 1 > "$dir/ncu.txt" 2>&1
  r=$?; rc=$(( rc || r ))
  summary+=("$name ncu rc=$r: $(grep -c 'Section:' "$dir/ncu.txt") sections")
}
part_fwdncu() {
  # design B's forward: its first FWD_NCU_COUNT (default 2) launches (the bits checks', one a config) at FWD_EDGES
  probe_ncu fwdncu forward gluon_forward "${FWD_NCU_COUNT:-2}" scripts/gluon_forward_probe.py --edges "${FWD_EDGES:-300003}"
}
part_chainncu() {
  # design B's chain: the first CHAIN_NCU_COUNT (default 4) launches of CHAIN_FORMS (the bits checks', one a
  # config, in the probe's order) at GLUON_ROWS
  probe_ncu chainncu chain gluon_chain "${CHAIN_NCU_COUNT:-4}" scripts/gluon_chain_probe.py \
    --forms "${CHAIN_FORMS:-chain-inflight,chain-prefetch-swizzle}" --rows "${GLUON_ROWS:-600006}" \
    --layers "${CHAIN_LAYERS:-4}"
}
part_aoti() {
  # AOTInductor's loader: a packaged nn.Linear loaded every way (each in its own process, faulthandler
  # on), then a backtrace below Python of the first path under cuda-gdb (the machine has no gdb)
  mkdir -p "$OUT/aoti"
  timeout "$(left)" python3 repro/aoti_loader_crash.py --out /tmp/aoti 2>&1 | tee "$OUT/aoti/repro.log" | tail -n 12
  r=${PIPESTATUS[0]}; summary+=("aoti repro rc=$r: $(grep -c ': exit 0' "$OUT/aoti/repro.log") of the loading paths ran")
  if [ "${AOTI_GDB:-1}" != 0 ] && [ -f /tmp/aoti/linear-cuda.pt2 ] && command -v cuda-gdb > /dev/null; then
    timeout 120 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 repro/aoti_loader_crash.py \
      --step load --package /tmp/aoti/linear-cuda.pt2 > "$OUT/aoti/cuda-gdb.log" 2>&1
    summary+=("aoti cuda-gdb rc=$?: $(grep -m1 -E 'signal|exited' "$OUT/aoti/cuda-gdb.log")")
  fi
}
part_pt2() {
  mkdir -p "$OUT/pt2"
  timeout "$(left)" python3 scripts/pt2_check.py --out "$OUT/pt2" --levels "${PT2_LEVELS:-1,2,3}" 2>&1 \
    | tee "$OUT/pt2/pt2.log" | grep -E "^level|Error" | tail -n 8
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("pt2 rc=$r: $(grep -c '^level' "$OUT/pt2/pt2.log") levels frozen")
  rm -f "$OUT"/pt2/*.pt2
}
part_deepmd() {
  # deepmd-kit's SeZM models (wheels under .whl/): DEEPMD_TESTS (default the GPU tests of mixstack.deepmd,
  # the slow compiled one left out unless DEEPMD_TESTS_K says) then scripts/deepmd_gpu.sh's bench, its
  # variables (CONFIGS, VARIANTS, ATOMS, ROUNDS, MD_STEPS) passed on; under $OUT/deepmd
  mkdir -p "$OUT/deepmd"
  timeout "$(left)" python3 -m pytest ${DEEPMD_TESTS:-tests/gpu/test_gpu_deepmd.py} \
    -m gpu -q -p no:cacheprovider -rs --tb=short -k "${DEEPMD_TESTS_K:-not slow}" 2>&1 | tee "$OUT/deepmd/tests.log" | tail -n 30
  r=${PIPESTATUS[0]}; rc=$(( rc || r )); summary+=("deepmd gpu tests rc=$r: $(tail -n 1 "$OUT/deepmd/tests.log")")
  OUT="$OUT/deepmd" TESTS_SECONDS=0 BUDGET=$(( $(left) - 10 )) INSTALLED=1 bash scripts/deepmd_gpu.sh 2>&1 | tail -n 40
  summary+=("deepmd bench: $(grep -h 'exit' "$OUT"/deepmd/bench-*.log | tr '\n' ' ')")
}
part_deepmdlammps() {
  # deepmd-kit's freeze, DeepPot and LAMMPS pair_style deepmd, plain and with mixstack's plugin
  # (scripts/deepmd_lammps.sh with DEEPMD_LAMMPS_ARGS); the wheels are installed above
  mkdir -p "$OUT/deepmdlammps"
  OUT="$OUT/deepmdlammps" BUDGET=$(( $(left) - 10 )) WORK=${DEEPMD_LAMMPS_WORK:-/tmp/deepmd_lammps} \
    LAMMPS_CARRY=${DEEPMD_LAMMPS_CARRY:-.lammps-carry/lammps-runtime-deepmd.tar.xz} \
    bash scripts/deepmd_lammps.sh ${DEEPMD_LAMMPS_ARGS:---device cuda} 2>&1 | tail -n 40
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  summary+=("deepmd lammps rc=$r: $(grep -c '^- .* rc=0' "$OUT/deepmdlammps/summary.md" 2>/dev/null) steps rc=0, $(
    grep -c '^- .* rc=[1-9]' "$OUT/deepmdlammps/summary.md" 2>/dev/null) failed")
}
IFS=',' read -r -a parts <<< "$PARTS"
for part in "${parts[@]}"; do              # in the order PARTS names them
  case "$part" in
    tests|tune|retune|grid|gridcheck|model|md|breakdown|baseline|probe|stackprobe|deepmdprobe|pt2conv|restprobe|convprobe|train|lammps|scaling|tma|tmaprobe|gluonprobe|chainprobe|chainncu|fwdprobe|fwdncu|aoti|pt2|deepmd|deepmdlammps)
      "part_$part" ;;
    stack) part_stack "$@" ;;
    *) echo "unknown part '$part' (use tests, tune, retune, grid, gridcheck, stack, model, md, breakdown, baseline, probe, stackprobe, deepmdprobe, pt2conv, restprobe, convprobe, train, lammps, scaling, tma, tmaprobe, gluonprobe, chainprobe, chainncu, fwdprobe, fwdncu, aoti, pt2, deepmd, deepmdlammps)"; rc=2 ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
(cd "$OUT" && tar czf /tmp/gpu_check.tgz --exclude='*.lock' . && find . -mindepth 1 -not -name summary.txt -delete \
  && mv /tmp/gpu_check.tgz .)
exit $rc
